"""Metric definitions pinned on hand-made records: TTFT, TPOT, ITL, TBT, percentiles,
throughputs, cache hit rate, SLO attainment, goodput and the DistServe rate sweep."""

from __future__ import annotations

import pytest

from kvserve.loadgen.metrics import (
    RequestRecord,
    bucket_label,
    bucketed,
    cache_hit_rate,
    percentile,
    span_s,
    summarize,
)
from kvserve.loadgen.slo import (
    AbsoluteSlo,
    SloTargets,
    meets,
    relative_slo,
    sweep_goodput,
)


def record(
    chunks: list[float],
    out: int,
    *,
    start: float = 1.0,
    prompt: int = 100,
    cached: int | None = 0,
    error: str | None = None,
    status: int | None = 200,
    index: int = 0,
) -> RequestRecord:
    end = chunks[-1] if chunks else start + 0.5
    return RequestRecord(
        index, start, prompt, out, -1, start, end, tuple(chunks), out, prompt, cached, error, status
    )


def test_per_request_latencies() -> None:
    r = record([1.5, 1.7, 1.8, 2.5], out=5)  # the first chunk carried 2 tokens
    assert r.ttft_s == pytest.approx(0.5)
    assert r.e2e_s == pytest.approx(1.5)
    assert r.itl_s == pytest.approx([0.2, 0.1, 0.7])
    assert r.tpot_s == pytest.approx((1.5 - 0.5) / 4)
    assert r.tbt_s == pytest.approx(0.7)  # ceil(3 / 10) = 1 slowest gap


def test_tbt_is_the_mean_of_the_slowest_tenth_of_gaps() -> None:
    gaps = [0.1] * 9 + [0.5, 0.9]  # 11 gaps: the slowest ceil(1.1) = 2
    chunks = [1.0]
    for g in gaps:
        chunks.append(chunks[-1] + g)
    assert record(chunks, out=12).tbt_s == pytest.approx(0.7)
    gaps20 = [0.1] * 18 + [0.4, 0.6]  # 20 gaps: the slowest 2
    chunks = [1.0]
    for g in gaps20:
        chunks.append(chunks[-1] + g)
    assert record(chunks, out=21).tbt_s == pytest.approx(0.5)


def test_one_token_and_failed_requests_have_no_decode_metrics() -> None:
    one = record([1.2], out=1)
    assert one.ok and one.tpot_s is None and one.tbt_s is None and one.itl_s == []
    failed = record([], out=0, error="HTTP 503", status=503)
    assert not failed.ok and failed.rejected and failed.ttft_s is None
    assert not record([1.3], out=1, error="stream error").ok


def test_percentiles_interpolate_linearly_like_numpy() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile([5.0], 99) == 5.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summary_throughputs_and_distributions() -> None:
    records = [
        record([1.5, 2.0], out=2, prompt=100, cached=50, index=0),
        record([1.3, 1.4, 1.5], out=3, prompt=200, cached=0, index=1),
        record([], out=0, error="HTTP 429", status=429, index=2),
    ]
    s = summarize(records, duration_s=2.0)
    assert (s.requests, s.completed, s.failed, s.rejected) == (3, 2, 1, 1)
    assert s.request_throughput == 1.0
    assert s.output_throughput == 2.5
    assert s.total_token_throughput == (300 + 5) / 2
    assert s.ttft_s.mean == pytest.approx(0.4)
    assert s.ttft_s.p50 == pytest.approx(0.4)
    assert s.tpot_s.count == 2 and s.tpot_s.mean == pytest.approx((0.5 + 0.1) / 2)
    assert s.itl_s.count == 3
    assert s.cache_hit_rate == pytest.approx(50 / 300)
    assert s.slo_attainment is None and s.goodput_rps is None
    assert s.to_json()["ttft_s"]["count"] == 2


def test_cache_hit_rate_needs_usage() -> None:
    assert cache_hit_rate([record([1.5], out=1, cached=None, prompt=0)]) is None
    assert cache_hit_rate([]) is None


def test_attainment_counts_failures_as_misses_and_goodput_per_second() -> None:
    slo = AbsoluteSlo(SloTargets(ttft_s=0.5, tpot_s=0.2))
    fast = record([1.2, 1.3, 1.4], out=3)
    slow_first = record([1.9, 2.0], out=2)
    slow_decode = record([1.1, 1.6], out=2)
    one_token = record([1.1], out=1)  # no TPOT: meets it vacuously
    failed = record([], out=0, error="timeout", status=None)
    records = [fast, slow_first, slow_decode, one_token, failed]
    assert [slo.meets(r) for r in records] == [True, False, False, True, False]
    s = summarize(records, 4.0, slo.meets)
    assert s.slo_attainment == pytest.approx(2 / 5)
    assert s.goodput_rps == pytest.approx(0.5)
    assert meets(slow_first, SloTargets(tbt_s=0.2))


def test_relative_slo_uses_the_bucket_median_or_the_overall_one() -> None:
    unloaded = [
        record([1.1, 1.2], out=2, prompt=50),
        record([1.3, 1.4], out=2, prompt=60),
        record([1.5, 1.9], out=2, prompt=600),
    ]
    slo = relative_slo(unloaded, 10.0, 5.0, [128, 512])
    assert slo.targets(record([1.1], out=1, prompt=70)).ttft_s == pytest.approx(2.0)
    assert slo.targets(record([1.1], out=1, prompt=70)).tbt_s == pytest.approx(0.5)
    assert slo.targets(record([1.1], out=1, prompt=900)).ttft_s == pytest.approx(5.0)
    assert slo.targets(record([1.1], out=1, prompt=200)).ttft_s == pytest.approx(3.0)
    assert slo.to_json()["kind"] == "relative"
    with pytest.raises(ValueError):
        relative_slo([record([], out=0, error="x")], 10, 5, [128])


def test_sweep_goodput_interpolates_between_last_pass_and_first_fail() -> None:
    g = sweep_goodput([(1.0, 1.0), (3.0, 0.8), (2.0, 0.95)], threshold=0.9)
    assert g.highest_passing_rate == 2.0
    assert g.interpolated_rate == pytest.approx(2.0 + (0.95 - 0.9) / (0.95 - 0.8))
    assert sweep_goodput([(1.0, 0.95), (2.0, 0.92)]).interpolated_rate == 2.0
    assert sweep_goodput([(1.0, 0.5), (2.0, 0.4)]) == sweep_goodput([(2.0, 0.4), (1.0, 0.5)])
    assert sweep_goodput([(1.0, 0.5)]).interpolated_rate is None
    assert sweep_goodput([(1.0, 0.5)]).highest_passing_rate is None
    # a non-monotone curve: the interpolation stops at the first failure
    g = sweep_goodput([(1.0, 0.95), (2.0, 0.7), (3.0, 0.92)])
    assert g.highest_passing_rate == 3.0
    assert g.interpolated_rate is not None and g.interpolated_rate < 2.0
    assert sweep_goodput([(1.0, 0.95), (float("inf"), 0.1)]).interpolated_rate == 1.0
    assert sweep_goodput([(1.0, None)]).interpolated_rate is None


def test_buckets_and_span() -> None:
    assert [bucket_label(v, [128, 512]) for v in (5, 128, 300, 512, 9000)] == [
        "<128",
        "128-512",
        "128-512",
        ">=512",
        ">=512",
    ]
    assert bucket_label(5, []) == "all"
    records = [record([1.5], out=1, prompt=50), record([2.5], out=1, prompt=700, start=2.0)]
    by_input = bucketed(records, 2.0, [128], lambda r: r.prompt_len)
    assert list(by_input) == ["<128", ">=128"]
    assert by_input[">=128"]["completed"] == 1
    assert span_s(records) == pytest.approx(1.5)
    assert span_s([]) == 0.0


def test_server_counters_count_from_zero_when_absent_before() -> None:
    from kvserve.loadgen.counters import counters_delta, parse_counters

    empty = parse_counters(
        "# HELP kvserve:kv_transfer_bytes_total bytes\n"
        "# TYPE kvserve:kv_transfer_bytes_total counter\n"
    )
    later = parse_counters('kvserve:kv_transfer_bytes_total{direction="write"} 10.0\n')
    assert empty == {} and later
    assert counters_delta(empty, later) == later  # first use: everything is new
    assert counters_delta(empty, empty) is None  # a server without our counters
    assert counters_delta(None, later) is None  # could not read it before


def test_prompt_sources_read_back_from_vllm_names() -> None:
    from kvserve.loadgen.counters import parse_counters

    text = "".join(
        f'vllm:prompt_tokens_by_source_total{{model_name="m",worker="{w}",source="{s}"}} {n}\n'
        for w, s, n in [
            ("p0", "local_cache_hit", 3),
            ("p1", "local_cache_hit", 4),
            ("p0", "external_kv_transfer", 5),
            ("p0", "local_compute", 6),
        ]
    )
    assert parse_counters(text) == {"prompt_tokens": {"local": 7, "pool": 5, "computed": 6}}
