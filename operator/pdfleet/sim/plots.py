"""PNG plots of simulator runs (matplotlib, Agg backend): a timeline per policy and SLA vs GPU-hours."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from pdfleet.sim.core import SimResult
from pdfleet.sim.report import PolicySummary, timeline


def _steps(result: SimResult, pool: str) -> tuple[list[float], list[int], list[int]]:
    """Minutes, ready and total replicas of a pool, as step-plot points."""
    t, ready, total = [], [], []
    for event in result.timeline:
        if event.pool == pool:
            t.append(event.time / 60.0)
            ready.append(event.ready)
            total.append(event.total)
    if t:
        t.append(max(result.horizon_s, t[-1] * 60.0) / 60.0)
        ready.append(ready[-1])
        total.append(total[-1])
    return t, ready, total


def _drawn(t: list[float], values: list[float]) -> tuple[list[float], list[float]]:
    """The minutes that have a value: a minute between two empty ones is still drawn (as a marker)."""
    points = [(x, v) for x, v in zip(t, values) if not math.isnan(v)]
    return [x for x, _ in points], [v for _, v in points]


def plot_timeline(result: SimResult, path: Path) -> None:
    """Load, replicas per pool and p90 latency per minute of one run."""
    series = timeline(result)
    fleet = result.fleet
    fig, (load, replicas, latency) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    load.plot(series["t"], series["load_rps"], color="tab:gray")
    load.set_ylabel("arrivals req/s")
    load.set_title(f"{result.policy}: {fleet.model} on {fleet.gpus_per_replica}x {fleet.gpu} per replica")
    pools = sorted({e.pool for e in result.timeline}, reverse=True)
    for pool, color in zip(pools, ("tab:blue", "tab:orange")):
        t, ready, total = _steps(result, pool)
        replicas.step(t, total, where="post", color=color, label=f"{pool} (held)")
        replicas.step(t, ready, where="post", color=color, linestyle="--", alpha=0.6, label=f"{pool} (ready)")
    replicas.set_ylabel("replicas")
    replicas.legend(loc="upper left", fontsize=8)
    latency.plot(*_drawn(series["t"], series["ttft_p90_ms"]), color="tab:blue", marker=".", label="TTFT p90")
    latency.axhline(fleet.ttft_ms, color="tab:blue", linestyle=":", label=f"TTFT target {fleet.ttft_ms:g} ms")
    latency.plot(*_drawn(series["t"], series["tpot_p90_ms"]), color="tab:orange", marker=".", label="TPOT p90")
    latency.axhline(fleet.tpot_ms, color="tab:orange", linestyle=":", label=f"TPOT target {fleet.tpot_ms:g} ms")
    latency.set_yscale("log")
    latency.set_ylabel("ms (per arrival minute)")
    latency.set_xlabel("minutes")
    latency.legend(loc="upper left", fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_sla_vs_cost(rows: list[PolicySummary], path: Path, title: str) -> None:
    """SLA attainment against GPU-hours, one point per policy, named in a legend beside the axes (labels next to the
    points overlap wherever policies land close together)."""
    fig, ax = plt.subplots(figsize=(9, 5))
    markers = "osD^vP*Xh<>p"
    for i, row in enumerate(rows):
        if math.isnan(row.sla_attainment):
            continue
        ax.scatter(row.gpu_hours, row.sla_attainment * 100, marker=markers[i % len(markers)], label=row.policy)
    ax.axhline(99, color="gray", linestyle=":", label="99 % of requests within SLA")
    ax.set_xlabel("GPU-hours")
    ax.set_ylabel("requests within SLA %")
    ax.set_title(title)
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
