"""Admission control (router.placement.admission): the TTFT prediction and the 429 it leads to."""

from __future__ import annotations

from router.errors import too_busy
from router.placement.admission import Rejection, admit, predicted_ttft_s, prefilling_worker
from router.placement.policies import Placement, PlacementRequest, WorkerLoad

P1 = WorkerLoad("p1", "prefill", queued_prefill_tokens=500, prefill_tokens_per_s=100.0)
D1 = WorkerLoad("d1", "decode", queued_prefill_tokens=40, prefill_tokens_per_s=20.0)
D2 = WorkerLoad("d2", "decode", queued_prefill_tokens=0, prefill_tokens_per_s=0.0)
REQUEST = PlacementRequest(prompt_tokens=300, pooled_tokens=100)  # 200 uncached
DISAGG = Placement("p1", ("d1", "d2"))
LOCAL = Placement(None, ("d1", "d2"))


def test_predicted_ttft_is_queue_plus_uncached_over_speed() -> None:
    assert predicted_ttft_s(P1, REQUEST) == 7.0  # (500 + 200) / 100
    assert predicted_ttft_s(D1, REQUEST) == 12.0  # (40 + 200) / 20
    assert predicted_ttft_s(P1, PlacementRequest(prompt_tokens=10, pooled_tokens=50)) == 5.0
    assert predicted_ttft_s(D2, REQUEST) is None  # speed not measured yet
    assert predicted_ttft_s(WorkerLoad("x", "decode", prefill_tokens_per_s=-1.0), REQUEST) is None


def test_the_prediction_leaves_out_what_the_workers_own_cache_holds() -> None:
    held = PlacementRequest(prompt_tokens=300, pooled_tokens=100, local_tokens={"p1": 250})
    assert predicted_ttft_s(P1, held) == 5.5  # (500 + 300 - 250) / 100
    assert predicted_ttft_s(D1, held) == 12.0  # (40 + 300 - 100) / 20: d1 holds nothing


def test_the_prefilling_worker() -> None:
    assert prefilling_worker(DISAGG) == "p1"
    assert prefilling_worker(LOCAL) == "d1"


def test_admit() -> None:
    loads = [P1, D1, D2]
    assert admit(DISAGG, REQUEST, loads, 7.0) is None  # at the limit: admitted
    assert admit(DISAGG, REQUEST, loads, 6.5) == Rejection("p1", 7.0, 6.5)
    assert admit(DISAGG, REQUEST, loads, 0.0) is None  # 0: admission control off
    assert admit(LOCAL, REQUEST, loads, 10.0) == Rejection("d1", 12.0, 10.0)
    assert admit(Placement(None, ("d2", "d1")), REQUEST, loads, 0.001) is None  # unknown speed
    assert admit(Placement("gone", ("d1",)), REQUEST, loads, 0.001) is None  # no report


def test_retry_after_is_the_excess_in_whole_seconds() -> None:
    assert Rejection("p1", 7.0, 6.5).retry_after_s == 1
    assert Rejection("p1", 75.2, 60.0).retry_after_s == 16
    assert Rejection("p1", 61.0, 60.0).retry_after_s == 1
    assert Rejection("p1", 75.2, 60.0).message == (
        "The server is overloaded: this request's first token is predicted in 75.2 s, over "
        "the 60 s limit. Retry after 16 s."
    )


def test_too_busy_is_an_openai_429() -> None:
    err = too_busy("busy", 15.2)
    assert err.status == 429 and err.headers == {"Retry-After": "16"}
    assert err.body() == {
        "error": {
            "message": "busy",
            "type": "rate_limit_error",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    assert too_busy("busy", 0.0).headers == {"Retry-After": "1"}
