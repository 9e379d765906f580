"""The benchmark plots on tiny inputs: each writes a PNG; the heatmap has one colour scale,
the shared pool is drawn once, the latency CDFs are on a log axis, moves are named in the
legend, and ``bench compare``'s plots are drawn again from the file ``--out`` saves."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from kvserve.bench import compare
from kvserve.bench.trace import plot as trace_plot
from kvserve.cli import build_parser
from kvserve.loadgen import plots, shift_scenario
from kvserve.loadgen.metrics import RequestRecord
from kvserve.loadgen.shift import parse_phase
from kvserve.sim import ratio_plot


def record(index: int, start_s: float, chunks: tuple[float, ...]) -> RequestRecord:
    return RequestRecord(
        index=index,
        arrival_s=start_s,
        prompt_len=8,
        max_tokens=len(chunks),
        group=0,
        start_s=start_s,
        end_s=chunks[-1],
        chunk_times_s=chunks,
        output_tokens=len(chunks),
    )


RECORDS = [record(0, 0.0, (0.5, 0.6, 0.6, 0.9)), record(1, 0.2, (1.4, 1.5))]
"""Two requests; the first has an ITL of 0 (two chunks at once), which a log axis cannot
place."""


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures the plot functions save, kept open for inspection (files still written)."""
    kept: list[Any] = []

    def keep(fig: Any, path: Path) -> Path:
        kept.append(fig)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=40)
        return path

    for module in (plots, trace_plot, ratio_plot):  # shift_scenario takes plots.save
        monkeypatch.setattr(module, "save", keep)
    return kept


def test_positive_cdf_points_keep_every_share() -> None:
    assert plots.cdf_points([0.0, 2.0, 1.0, 4.0]) == ([0.0, 1.0, 2.0, 4.0], [0.25, 0.5, 0.75, 1.0])
    assert plots.positive_cdf_points([0.0, 2.0, 1.0, 4.0]) == ([1.0, 2.0, 4.0], [0.5, 0.75, 1.0])


def test_latency_cdfs_are_on_a_log_axis(tmp_path: Path, figures: list[Any]) -> None:
    path = plots.latency_cdfs([("a", RECORDS), ("b", RECORDS[:1])], tmp_path / "cdf.png")
    assert path.stat().st_size > 0
    axes = figures[0].axes
    assert [ax.get_xscale() for ax in axes] == ["log", "log", "log"]
    itl = axes[2].lines[0].get_xdata()
    assert len(itl) == 3 and min(itl) > 0  # 4 gaps, the 0 one left out of the drawing


def ratio_row(mix: str, prefill: int, goodput: float, **flags: bool) -> dict[str, Any]:
    return {"mix": mix, "prefill": prefill, "colocated": prefill == 0, "goodput_rps": goodput,
            **flags}  # fmt: skip


def test_the_heatmap_has_one_colour_scale(tmp_path: Path, figures: list[Any]) -> None:
    rows = [
        ratio_row("a", 1, 4.0),
        ratio_row("a", 2, 8.0, in_band=True, best=True),
        ratio_row("a", 0, 2.0),
        ratio_row("b", 1, 128.0, goodput_lower_bound=True, in_band=True, best=True),
        ratio_row("b", 2, 0.0),
        ratio_row("b", 0, 128.0, goodput_lower_bound=True),
    ]
    path = ratio_plot.plot(rows, ["a", "b"], 3, tmp_path / "ratio.png")
    assert path.stat().st_size > 0
    image = figures[0].axes[0].images[0]
    norm = image.norm
    assert (norm.vmin, norm.vmax) == (2.0, 128.0)  # the whole map's range, not a row's
    # a row's best is not the top of the scale: 8 req/s is shaded as 8, not as 1.0
    assert 0.0 < norm(8.0) < 0.5 < norm(128.0) == 1.0
    assert image.get_array()[1][1] == 2.0  # goodput 0 takes the lowest colour
    assert len(figures[0].axes) == 2  # the colour bar


def test_colour_ticks() -> None:
    assert ratio_plot.colour_ticks(4.45, 128.0) == [4.45, 10.0, 20.0, 50.0, 100.0, 128.0]
    assert ratio_plot.colour_ticks(3.0, 3.0) == [3.0, 3.0]


def cluster_row(workers: int, policy: str, local: float) -> dict[str, Any]:
    return {
        "section": "cluster",
        "capacity_blocks": 1000,
        "workers": workers,
        "policy": policy,
        "token_hit_rate_local": local,
        "token_hit_rate_shared": 0.6,
    }


def test_the_shared_pool_is_drawn_once(tmp_path: Path, figures: list[Any]) -> None:
    lru = {"token_hit_rate": 0.5}
    rows = [
        {"section": "capacity", "capacity_blocks": 100, "lru": lru, "pool": lru},
        {"section": "capacity", "capacity_blocks": 1000, "lru": lru, "pool": lru},
        *(cluster_row(n, p, 0.1 * n) for n in (2, 4) for p in ("round_robin", "cache_aware")),
        {**cluster_row(2, "round_robin", 0.9), "capacity_blocks": 10},  # a smaller capacity
    ]
    files = trace_plot.plot(rows, tmp_path)
    assert [f.name for f in files] == ["hit_rate_vs_capacity.png", "local_vs_shared.png"]
    assert all(f.stat().st_size > 0 for f in files)
    ax = figures[1].axes[0]
    assert len(ax.patches) == 4  # 2 worker counts x 2 policies, the capacity-10 row left out
    assert [tuple(line.get_ydata()) for line in ax.lines] == [(0.6, 0.6)]


def test_moves_are_named_in_the_legend(tmp_path: Path, figures: list[Any]) -> None:
    move = {"worker_id": "d7", "from_role": "decode", "to_role": "prefill"}
    rows = [
        {"controller": "off", "attainment_over_time": [[5.0, 1.0], [10.0, None]], "moves": []},
        {
            "controller": "on",
            "attainment_over_time": [[5.0, 1.0], [10.0, 0.5]],
            "moves": [{**move, "decided_s": 15.0, "done_s": 17.6}, {**move, "done_s": None}],
        },
    ]
    phases = [parse_phase("64:16@2x10"), parse_phase("16:64@2x10")]
    path = shift_scenario.plot(rows, phases, tmp_path / "shift.png", "title")
    assert path.stat().st_size > 0
    legend = [t.get_text() for t in figures[0].axes[0].get_legend().get_texts()]
    assert legend == [
        "controller off",
        "controller on",
        "d7 decode -> prefill, decided at 15 s, done at 18 s",
    ]
    assert shift_scenario.move_label({**move, "decided_s": 40.2, "done_s": 40.4}) == (
        "d7 decode -> prefill at 40 s"
    )


def compare_results() -> dict[tuple[str, str], dict[str, Any]]:
    from kvserve.loadgen.slo import SweepGoodput

    return {
        ("1p1d", "cache_aware"): {
            "points": [(0.5, 1.0), (float("inf"), 0.5)],
            "sweep": SweepGoodput(0.9, 0.5, 0.6),
            "runs": [("rate 0.5", RECORDS), ("rate inf", RECORDS[1:])],
        },
        ("2m", "cache_aware"): {"points": [(0.5, 0.8)], "sweep": None, "runs": [("rate 0.5", [])]},
    }


def test_compare_plots_are_drawn_again_from_the_saved_runs(
    tmp_path: Path, figures: list[Any]
) -> None:
    results = compare_results()
    written = compare.write_plots(tmp_path / "run", results)
    saved = tmp_path / "run" / compare.RUNS_FILE
    assert written[0] == saved
    runs = json.loads(saved.read_text())["runs"]
    assert runs == json.loads(json.dumps(compare.saved_runs(results)))
    assert [r["points"] for r in runs] == [[[0.5, 1.0], ["inf", 0.5]], [[0.5, 0.8]]]
    args = build_parser("bench").parse_args(["bench", "compare", "--replot", str(saved)])
    assert compare.run(argparse.Namespace(**{**vars(args), "out": tmp_path / "again"})) == 0
    names = ["attainment_vs_rate.png", "goodput.png", "latency_cdf.png"]
    assert sorted(p.name for p in (tmp_path / "again").iterdir()) == names
    assert [f.name for f in written[1:]] == names
