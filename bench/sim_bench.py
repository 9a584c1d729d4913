"""Simulator speed: wall time per policy for the Azure conv trace (~19k requests over ~58 min).

Usage: .venv/bin/python bench/sim_bench.py [--trace PATH] [--load-scale N] [--policies a,b]
Falls back to a synthetic one-hour diurnal trace of the same rate when the shared traces are absent.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pdfleet.sim.config import FleetConfig
from pdfleet.sim.policies import POLICY_NAMES
from pdfleet.sim.run import load_workload, run_policy
from pdfleet.sim.trace import trace_stats

CONV = (
    Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
)
FALLBACK = "synthetic:diurnal:duration_s=3500,base_rps=4,peak_rps=7,period_s=3500,prompt_median=1020,output_median=129"
BUDGET_S = 30.0  # the target per policy for a one-hour ~20k-request trace


def main(argv: list[str]) -> int:
    """Print requests, events, wall seconds and events/s per policy; exit 1 if a policy exceeds BUDGET_S."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--trace", default=str(CONV) if CONV.exists() else FALLBACK)
    p.add_argument("--load-scale", type=int, default=1)
    p.add_argument("--policies", default=",".join(POLICY_NAMES))
    args = p.parse_args(argv)
    workload = load_workload(args.trace, args.load_scale)
    stats = trace_stats(workload.requests)
    fleet = FleetConfig()
    print(
        f"{workload.name}: {stats['requests']} requests over {stats['duration_s'] / 60:.1f} min; "
        f"fleet {fleet.model} on {fleet.gpus_per_replica}x {fleet.gpu}"
    )
    print(f"{'policy':<12} {'wall s':>7} {'events':>9} {'events/s':>9} {'sim-s per wall-s':>17}")
    slowest = 0.0
    for name in args.policies.split(","):
        run = run_policy(name, fleet, workload.requests)
        slowest = max(slowest, run.wall_s)
        print(
            f"{name:<12} {run.wall_s:>7.2f} {run.result.events:>9} {run.result.events / run.wall_s:>9.0f} "
            f"{stats['duration_s'] / run.wall_s:>17.0f}"
        )
    verdict = "within" if slowest <= BUDGET_S * args.load_scale else "OVER"
    print(f"slowest policy {slowest:.2f} s: {verdict} the {BUDGET_S:g} s budget per {args.load_scale}x trace")
    return 0 if verdict == "within" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
