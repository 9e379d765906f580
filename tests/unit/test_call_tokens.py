"""The router's call tokens (:mod:`proto.call_tokens`): what a worker accepts, exactly, on a
clock the test moves."""

from __future__ import annotations

import base64

import pytest

from proto.call_tokens import CLOCK_SKEW_S, LIFETIME_S, Signer, Verifier, public_key
from proto.trust import ROUTER, ROUTER_SIGN, derive

SEED = derive("s" * 64, ROUTER_SIGN)
PUBLIC = public_key(SEED)
HERE, THERE = "10.0.0.5:50051", "10.0.0.6:50051"


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def parts(token: str) -> list[str]:
    return token.split(".")


def test_a_token_is_addressed_checked_and_expires() -> None:
    clock = Clock()
    token = Signer(SEED, ROUTER, clock).token(HERE)
    identity, expiry, audience, _ = parts(token)
    assert (identity, int(expiry)) == (ROUTER, int((clock.now + LIFETIME_S) * 1000))
    assert base64.urlsafe_b64decode(audience + "==").decode() == HERE
    here, there = Verifier(PUBLIC, lambda: HERE, clock), Verifier(PUBLIC, lambda: THERE, clock)
    assert here.why_not(token) is None
    assert "addressed to '10.0.0.5:50051', not to this worker" in str(there.why_not(token))
    clock.now += LIFETIME_S  # the last millisecond it is valid, then not
    assert here.why_not(token) is None
    clock.now += 0.001
    assert here.why_not(token) == "the router token has expired"
    assert Verifier(PUBLIC, lambda: HERE, clock).why_not(token) == "the router token has expired"


def test_the_signer_reuses_a_token_for_half_its_life_per_audience() -> None:
    clock = Clock()
    signer = Signer(SEED, ROUTER, clock)
    first = signer.token(HERE)
    assert signer.token(HERE) == first != signer.token(THERE)
    clock.now += LIFETIME_S / 2 - 0.001
    assert signer.token(HERE) == first
    clock.now += 0.001
    renewed = signer.token(HERE)
    assert renewed != first and Verifier(PUBLIC, lambda: HERE, clock).why_not(renewed) is None


def test_forgeries_and_tokens_minted_to_last_are_refused() -> None:
    clock = Clock()
    verifier = Verifier(PUBLIC, lambda: HERE, clock)
    other_key = Signer(derive("o" * 64, ROUTER_SIGN), ROUTER, clock).token(HERE)
    assert verifier.why_not(other_key) == "the router token's signature does not check"
    identity, expiry, audience, signature = parts(Signer(SEED, ROUTER, clock).token(HERE))
    later = f"{identity}.{int(expiry) + 1}.{audience}.{signature}"  # expiry moved: not signed
    assert verifier.why_not(later) == "the router token's signature does not check"
    moved = base64.urlsafe_b64encode(THERE.encode()).decode().rstrip("=")
    readdressed = Verifier(PUBLIC, lambda: THERE, clock)
    assert "signature" in str(readdressed.why_not(f"{identity}.{expiry}.{moved}.{signature}"))
    future = Clock(clock.now + CLOCK_SKEW_S + 0.01)  # a router clock ahead by more than the skew
    ahead = Signer(SEED, ROUTER, future).token(HERE)
    assert "too far ahead" in str(verifier.why_not(ahead))
    within = Signer(SEED, ROUTER, Clock(clock.now + CLOCK_SKEW_S)).token(HERE)
    assert verifier.why_not(within) is None


@pytest.mark.parametrize(
    "token",
    [
        "",
        "router",
        "router.1.2",
        "router.x.aGk.c2ln",
        "router.1.aGk.c2ln.extra",
        "router.1.aGk.c2ln",  # a 3-byte signature
        "router.1.A.c2ln",  # not base64
        "router.1./w.c2ln",  # an audience that is not UTF-8
        "router.9999999999999999.aGk.c2ln",  # 16 digits
        "router.1.aGk." + "A" * 600,
        "router.1.aGk.\u00e9",
    ],
)
def test_malformed_tokens_are_refused_before_any_signature_check(token: str) -> None:
    assert Verifier(PUBLIC, lambda: HERE, Clock()).why_not(token) == "the router token is malformed"
