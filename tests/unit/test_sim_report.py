"""Report numbers, the simulate command end to end on a small synthetic trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdfleet.sim import cli
from pdfleet.sim.config import FleetConfig
from pdfleet.sim.core import Replica, SimResult
from pdfleet.sim.report import PolicySummary, gpu_hours, peak_gpus, quantile, target_verdict


def test_quantile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (quantile(values, 0.5), quantile(values, 0.9), quantile(values, 0.99)) == (50, 90, 99)
    assert quantile([], 0.5) != quantile([], 0.5)  # NaN


def test_gpu_hours_count_until_the_last_completion() -> None:
    def replica(created: float, removed: float | None) -> Replica:
        return Replica(engine=None, gpus=2, created_at=created, ready_at=created, removed_at=removed)  # type: ignore

    result = SimResult(
        "p",
        FleetConfig(),
        [],
        [replica(0, None), replica(1800, 2700), replica(3000, None)],
        [],
        horizon_s=3600,
        end_s=3700,
        events=0,
    )
    assert gpu_hours(result) == pytest.approx(2 * (3700 + 900 + 700) / 3600)  # to end_s, after the last arrival
    assert peak_gpus(result) == 4


def _row(policy: str, sla: float, hours: float) -> PolicySummary:
    nan = float("nan")
    return PolicySummary(policy, 10, 10, nan, nan, nan, nan, nan, nan, sla, nan, hours, nan, nan, 0, 0)


def test_verdict_lines() -> None:
    rows = [
        _row("pdfleet", 0.995, 70),
        _row("static-peak", 0.999, 100),
        _row("hpa-queue", 0.9, 80),
        _row("planner", 0.5, 50),
    ]
    lines = target_verdict(rows)
    assert "met" in lines[0] and "NOT" not in lines[0]
    assert "0.70x" in lines[1] and "NOT" not in lines[1]
    assert "not worse" in lines[2] and "does NOT dominate" in lines[3]


def test_verdict_compares_the_families_where_the_points_do_not_dominate() -> None:
    rows = [
        _row("pdfleet", 0.993, 47),
        _row("pdfleet-budget28", 0.51, 26),
        _row("planner", 0.17, 27),
        _row("planner-h50", 0.984, 43),
        _row("planner-h40", 0.994, 51),
    ]
    lines = target_verdict(rows)
    assert "does NOT dominate" in lines[1]
    assert lines[2] == "  at equal SLA: the cheapest planner run reaching 99.30% is planner-h40 with 51.0 GPU-h vs 47.0"
    assert lines[3] == "  at equal cost: pdfleet-budget28 dominates planner (SLA 51.00%, GPU-h 26.0)"
    unreached = target_verdict([_row("pdfleet", 0.95, 13), _row("planner", 0.21, 3), _row("planner-h40", 0.48, 5)])
    assert unreached[-1] == "  at equal SLA: no planner run reaches 95.00% (best: planner-h40, 48.00% at 5.0 GPU-h)"


def test_simulate_command_writes_summary_and_plots(tmp_path: Path) -> None:
    code = cli.main(
        [
            "--trace",
            "synthetic:burst:duration_s=240,base_rps=3,peak_rps=15,period_s=120,burst_s=30",
            "--policies",
            "static-peak,pdfleet-seeded,planner-h,colocated",
            "--tuned",
            'pdfleet-seeded={"seedCapacity": true}',
            "--tuned",
            'planner-h={"prefillUtilization": 0.5, "decodeUtilization": 0.8}',
            "--fleet",
            "model=llama-3.1-8b gpus_per_replica=1 racks=2 gpus_per_rack=8 startup_s=30",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    out = tmp_path / "synthetic-burst"
    summary = json.loads((out / "summary.json").read_text())
    assert [p["policy"] for p in summary["policies"]] == ["static-peak", "pdfleet-seeded", "planner-h", "colocated"]
    assert all(p["completed"] == p["requests"] for p in summary["policies"])
    assert "| static-peak |" in (out / "summary.md").read_text()
    assert (out / "sla_vs_gpu_hours.png").stat().st_size > 0
    assert (out / "timeline-pdfleet-seeded.png").stat().st_size > 0


def test_simulate_command_rejects_unknown_policy(tmp_path: Path) -> None:
    assert cli.main(["--trace", "synthetic:steady", "--policies", "magic", "--out", str(tmp_path)]) == 2
    assert (
        cli.main(
            ["--trace", "synthetic:steady", "--tuned", 'planner-x={"prefillUtilization": 2}', "--out", str(tmp_path)]
        )
        == 2
    )


def test_plots_draw_every_minute_with_data_and_name_policies_without_overlapping_labels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pdfleet.sim import plots

    nan = float("nan")
    assert plots._drawn([0.0, 1.0, 2.0, 3.0], [nan, 5.0, nan, 7.0]) == ([1.0, 3.0], [5.0, 7.0])
    saved = []
    monkeypatch.setattr(plots.plt, "close", saved.append)
    plots.plot_sla_vs_cost([_row("pdfleet", 0.99, 10), _row("planner", 0.98, 10.1)], tmp_path / "s.png", "t")
    (ax,) = saved[0].axes
    assert len(ax.texts) == 0  # no labels next to points (they overlapped)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:2] == ["pdfleet", "planner"]
    assert not any("target" in label for label in labels)
