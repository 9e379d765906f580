"""The cluster secret, grants cut from it, and what each role's grant can and cannot do
(:mod:`proto.credentials`, :mod:`proto.grants`)."""

from __future__ import annotations

import base64
import json

import pytest

from kvpool.hashing import Namespace, PrefixHasher
from proto.call_tokens import Verifier, public_key
from proto.credentials import GRANT_PREFIX, Credentials, NotGrantedError, token_matches
from proto.grants import SCOPES, grant
from proto.grpc_auth import MONITOR, ROUTER
from proto.record_store import open_contract, seal_contract
from proto.registry import UNSHARED_KEY, ClusterConfig
from proto.trust import (
    POOL_BLOCK,
    PREFIX_ROOT,
    PURPOSES,
    REGISTRY_RECORD,
    ROUTER_SIGN,
    derive,
    grpc_token,
)

SECRET = "k" * 64


def encoded(body: object) -> str:
    raw = json.dumps(body).encode()
    return GRANT_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def test_a_grant_holds_exactly_its_scope_and_agrees_with_the_secret() -> None:
    full = Credentials.of(SECRET)
    for holder, scope in SCOPES.items():
        held = Credentials.of(grant(SECRET, holder))
        assert held.secured and not held.secret
        for purpose in PURPOSES:
            if purpose in scope.keys:
                assert held.key(purpose) == full.key(purpose) == derive(SECRET, purpose)
            else:
                with pytest.raises(NotGrantedError, match=purpose):
                    held.key(purpose)
        if MONITOR in scope.tokens:
            assert held.token(MONITOR) == grpc_token(SECRET, MONITOR)
        else:
            with pytest.raises(NotGrantedError, match=MONITOR):
                held.token(MONITOR)
        for identity in (ROUTER, MONITOR):
            assert held.verifier(identity) == (
                full.verifier(identity) if identity in scope.verifiers else None
            )
        if MONITOR in scope.verifiers:
            assert token_matches(held.verifier(MONITOR), grpc_token(SECRET, MONITOR))
            assert not token_matches(held.verifier(MONITOR), grpc_token("x" * 64, MONITOR))
        if ROUTER_SIGN in scope.keys:  # the router: it signs, and what it signs checks
            token = held.signer().token("w:1")
            assert Verifier(full.verifier(ROUTER) or b"", lambda: "w:1").why_not(token) is None
        else:
            with pytest.raises(NotGrantedError, match=ROUTER_SIGN):
                held.signer()


def test_the_routers_verifier_is_the_public_key_of_its_signing_key() -> None:
    full = Credentials.of(SECRET)
    assert full.verifier(ROUTER) == public_key(derive(SECRET, ROUTER_SIGN))
    with pytest.raises(ValueError, match="signed for each worker"):
        full.token(ROUTER)  # no bearer token of the router exists any more


def test_the_roles_hold_what_the_threat_model_says() -> None:
    """A worker cannot call as the router (no signing key); the router cannot make a pool
    block's MAC."""
    assert SCOPES["worker"].tokens == (MONITOR,) and ROUTER_SIGN not in SCOPES["worker"].keys
    assert set(SCOPES["worker"].verifiers) == {ROUTER, MONITOR}
    assert POOL_BLOCK not in SCOPES["router"].keys and SCOPES["router"].tokens == ()
    assert ROUTER_SIGN in SCOPES["router"].keys
    assert SCOPES["monitor"].keys == () and SCOPES["monitor"].verifiers == ()


def test_the_router_and_a_worker_agree_on_chains_and_records_but_not_block_keys() -> None:
    worker = ClusterConfig(cluster_secret=grant(SECRET, "worker"))
    router = ClusterConfig(cluster_secret=grant(SECRET, "router"))
    full = ClusterConfig(cluster_secret=SECRET)
    namespace = Namespace("m", "float32", 16)
    hashers = [PrefixHasher(namespace, c.keyring.prefix_root) for c in (worker, router, full)]
    chains = {tuple(h.chain(list(range(64)), 16)) for h in hashers}
    assert len(chains) == 1 and len(next(iter(chains))) == 4
    assert worker.keyring.pool_block == full.keyring.pool_block == derive(SECRET, POOL_BLOCK)
    assert router.keyring.pool_block == UNSHARED_KEY != worker.keyring.pool_block
    assert open_contract(router.keys, seal_contract(worker.keys, "c1")) == "c1"


def test_grants_are_deterministic_and_kept_out_of_repr() -> None:
    assert grant(SECRET, "worker") == grant(SECRET, "worker") != grant(SECRET, "router")
    assert grant("", "worker") == ""  # no secret, nothing to cut
    cut = grant(SECRET, "worker")
    assert grant(cut, "monitor") == grant(SECRET, "monitor")  # a grant covers a smaller one
    with pytest.raises(NotGrantedError):
        grant(cut, "router")  # ...but never a wider one
    with pytest.raises(ValueError, match="unknown grant holder"):
        grant(SECRET, "admin")
    shown = repr(Credentials.of(cut)) + repr(ClusterConfig(cluster_secret=cut))
    assert (
        SECRET not in shown and cut not in shown and derive(SECRET, PREFIX_ROOT).hex() not in shown
    )


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (GRANT_PREFIX + "!!!", "base64url JSON"),
        (encoded([]), "an object of"),
        (encoded({"keys": {}, "tokens": {}}), "an object of"),
        (encoded({"keys": {"x": "00" * 32}, "tokens": {}, "verifiers": {}}), "unknown keys"),
        (encoded({"keys": {REGISTRY_RECORD: "00"}, "tokens": {}, "verifiers": {}}), "64 hex"),
        (encoded({"keys": {}, "tokens": {"router": "monitor.ab"}, "verifiers": {}}), "malformed"),
        (encoded({"keys": {}, "tokens": {"router": "router.ab"}, "verifiers": {}}), "malformed"),
        ("kvgrant1." + "A" * 40, "older kvserve"),
        (encoded({"keys": {}, "tokens": {}, "verifiers": {"router": 1}}), "map names"),
        (GRANT_PREFIX + "A" * 5000, "at most"),
        ("short", "at least"),
    ],
)
def test_malformed_settings_are_refused_naming_the_setting(setting: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        ClusterConfig(cluster_secret=setting)
    assert "cluster_secret" in str(raised.value)


def test_without_a_secret_every_key_is_the_empty_derivation() -> None:
    none = Credentials.of("")
    assert not none.secured
    assert all(none.key(p) == derive("", p) for p in PURPOSES)
    assert none.verifier(ROUTER) is None
    with pytest.raises(ValueError, match="no cluster secret"):
        none.grant((), (), ())
