"""The KV link and the layer-wise streaming pipeline, on hand-computed cases."""

from __future__ import annotations

import pytest

from kvserve.sim.link import Link, exposed_transfer_s, hidden_share, pipelined_exposed_s


def test_transfer_and_validation() -> None:
    assert Link(100.0, 0.5).transfer_s(50) == 1.0
    with pytest.raises(ValueError, match="bandwidth must be > 0"):
        Link(0.0)
    with pytest.raises(ValueError, match="latency_s must be >= 0"):
        Link(1.0, -1.0)
    with pytest.raises(ValueError, match="layers must be >= 1"):
        exposed_transfer_s(1.0, 1.0, 0, Link(1.0), streaming=True)


def test_without_streaming_all_of_it_is_exposed() -> None:
    assert exposed_transfer_s(8.0, 4.0, 4, Link(1.0, 0.25), streaming=False) == 4.25


def test_link_faster_than_compute_exposes_one_layer_send() -> None:
    # t_c = 2, t_x = 1: ends at 2 + 1 + 3 x 2 = 9, compute ends at 8.
    assert exposed_transfer_s(8.0, 4.0, 4, Link(1.0), streaming=True) == 1.0
    assert exposed_transfer_s(8.0, 4.0, 4, Link(1.0, 0.25), streaming=True) == 1.25
    # t_x << t_c: one layer's send, whatever the compute
    assert exposed_transfer_s(1000.0, 4.0, 4, Link(1.0), streaming=True) == 1.0


def test_link_slower_than_compute_exposes_transfer_minus_compute_plus_a_layer() -> None:
    # t_c = 1, t_x = 10: ends at 1 + 10 + 3 x 10 = 41 = 40 - 4 + 1 + compute.
    assert exposed_transfer_s(4.0, 40.0, 4, Link(1.0), streaming=True) == 37.0
    assert exposed_transfer_s(4e-3, 4e6, 4, Link(1.0), streaming=True) == pytest.approx(
        4e6 - 4e-3 + 1e-3
    )


def test_one_layer_is_no_pipeline() -> None:
    link = Link(2.0, 0.1)
    streamed = exposed_transfer_s(3.0, 5.0, 1, link, streaming=True)
    assert streamed == pytest.approx(exposed_transfer_s(3.0, 5.0, 1, link, streaming=False))


@pytest.mark.parametrize(
    ("compute", "nbytes", "layers"), [(8.0, 4.0, 4), (4.0, 40.0, 4), (3.0, 3.0, 3), (0.0, 5.0, 7)]
)
def test_pipeline_of_equal_stages_is_the_closed_form(
    compute: float, nbytes: float, layers: int
) -> None:
    link = Link(1.5, 0.2)
    stages = [(compute / layers, nbytes / layers)] * layers
    closed = exposed_transfer_s(compute, nbytes, layers, link, streaming=True)
    assert pipelined_exposed_s(stages, link) == pytest.approx(closed)
    assert closed <= exposed_transfer_s(compute, nbytes, layers, link, streaming=False)


def test_pipeline_of_unequal_stages_by_hand() -> None:
    # compute ends 1, 2, 5; sends [1, 4], [4, 5], [5, 5.5] -> exposed 0.5 (+ latency 0.1)
    stages = [(1.0, 3.0), (1.0, 1.0), (3.0, 0.5)]
    assert pipelined_exposed_s(stages, Link(1.0, 0.1)) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="at least one stage"):
        pipelined_exposed_s([], Link(1.0))


def test_hidden_share_bounds() -> None:
    # compute-bound at zero latency: all but the last layer's send is hidden
    assert hidden_share(8.0, 4.0, 4, Link(1.0)) == pytest.approx(0.75)
    # link-bound: ~ (layers - 1) t_c / (layers t_x) = 3 / 40
    assert hidden_share(4.0, 40.0, 4, Link(1.0)) == pytest.approx(3 / 40)
    assert hidden_share(1.0, 0.0, 4, Link(1.0)) == 1.0
    for gbps in (0.1, 1.0, 10.0):
        assert 0.0 <= hidden_share(8.0, 4.0, 4, Link(gbps, 0.3)) <= 0.75
