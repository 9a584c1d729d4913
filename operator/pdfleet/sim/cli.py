"""`pdfleet simulate`: replay traces against simulated fleets under several scaling policies, side by side.

Example:
    pdfleet simulate --trace ../shared/traces/azure2023/AzureLLMInferenceTrace_conv.csv --load-scale 8 \\
        --policies pdfleet,static-peak,static-mean,hpa-queue,planner,colocated --out sim-out
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from pdfleet.cli.argtypes import CommandParser, positive_int
from pdfleet.sim.config import fleet_from_options
from pdfleet.sim.policies import POLICY_NAMES, planner_options
from pdfleet.sim.report import markdown_table, summarize, target_verdict
from pdfleet.sim.run import load_workload, run_policy
from pdfleet.sim.trace import TIME_UNITS, trace_stats


def _parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="pdfleet simulate", description=__doc__)
    p.add_argument(
        "--trace",
        action="append",
        required=True,
        help="CSV/JSONL trace, or synthetic:<steady|ramp|burst|diurnal>[:field=value,...]; repeatable",
    )
    p.add_argument(
        "--policies",
        default=",".join(POLICY_NAMES),
        help=f"comma-separated, from {', '.join(POLICY_NAMES)} and --tuned names",
    )
    p.add_argument("--out", required=True, type=Path, help="output folder (one subfolder per trace)")
    p.add_argument("--load-scale", type=positive_int, default=1, help="superpose N jittered copies of each trace")
    p.add_argument("--limit", type=positive_int, help="keep the first N requests of each trace")
    p.add_argument(
        "--time-unit",
        choices=tuple(TIME_UNITS),
        help="unit of a trace's numeric arrival column where its format does not fix it (Mooncake JSONL: ms)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for synthetic traces, load scaling and prefixes")
    p.add_argument(
        "--fleet",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="FleetConfig field, e.g. model=llama-3.1-8b gpus_per_replica=1 startup_s=60; repeatable",
    )
    p.add_argument(
        "--tuned",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="a pdfleet variant: NAME=JSON of API overrides, e.g. "
        '\'pdfleet-tuned={"seedCapacity": true, "prefill.targetLatencyMs": 300}\', or a planner '
        'variant with headroom: \'planner-h={"prefillUtilization": 0.4, "decodeUtilization": 0.8}\'; '
        "repeatable",
    )
    p.add_argument(
        "--shared-prefixes",
        metavar="GROUPS:TOKENS:SHARE",
        help="give SHARE of requests one of GROUPS shared prompt prefixes of TOKENS tokens",
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    return p


TUNABLE = ("pdfleet", "planner")  # the policies --tuned variants derive from


def _key_values(items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        for part in item.split():
            key, sep, value = part.partition("=")
            if not sep:
                raise ValueError(f"expected KEY=VALUE, got {part!r}")
            pairs[key] = value
    return pairs


def _tuned(items: list[str]) -> dict[str, dict[str, Any]]:
    variants = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.startswith(TUNABLE):
            raise ValueError(f"--tuned wants pdfleet-NAME=JSON or planner-NAME=JSON, got {item!r}")
        variants[name] = json.loads(text)
        if name.startswith("planner"):
            planner_options(variants[name])  # fail before any run
    return variants


def _prefixes(text: str | None) -> tuple[int, int, float] | None:
    if not text:
        return None
    groups, tokens, share = text.split(":")
    return int(groups), int(tokens), float(share)


def main(argv: list[str]) -> int:
    """Run every policy on every trace; write summary.md, summary.json and plots per trace under --out."""
    args = _parser().parse_args(argv)
    try:
        fleet = fleet_from_options(_key_values(args.fleet))
        tuned = _tuned(args.tuned)
        prefixes = _prefixes(args.shared_prefixes)
    except ValueError as exc:
        print(f"pdfleet simulate: {exc}", file=sys.stderr)
        return 2
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICY_NAMES and p not in tuned]
    if unknown:
        print(f"pdfleet simulate: unknown policies {unknown}", file=sys.stderr)
        return 2
    for spec in args.trace:
        try:
            workload = load_workload(
                spec, args.load_scale, args.seed, args.limit, prefixes, fleet.prefix_block_tokens, args.time_unit
            )
        except ValueError as exc:
            print(f"pdfleet simulate: {spec}: {exc}", file=sys.stderr)
            return 2
        out = args.out / workload.name
        out.mkdir(parents=True, exist_ok=True)
        stats = trace_stats(workload.requests)
        print(
            f"== {workload.name}: {stats['requests']} requests over {stats['duration_s']:.0f} s "
            f"({stats['rate_rps']:.1f} req/s)",
            flush=True,
        )
        rows, runs = [], []
        for name in policies:
            base = next((b for b in TUNABLE if name.startswith(b)), name) if name in tuned else name
            run = run_policy(base, fleet, workload.requests, tuned.get(name), name)
            rows.append(summarize(run.result))
            runs.append(run)
            print(f"   {name}: simulated in {run.wall_s:.1f} s ({run.result.events} events)", flush=True)
        table = markdown_table(rows)
        verdict = [line for row in rows for line in row.warnings] + target_verdict(rows)
        print(table)
        print("\n".join(verdict))
        _write(out, workload.name, stats, fleet, tuned, rows, runs, table, verdict)
        if not args.no_plots:
            from pdfleet.sim.plots import plot_sla_vs_cost, plot_timeline  # matplotlib only when plotting

            for run in runs:
                plot_timeline(run.result, out / f"timeline-{run.result.policy}.png")
            plot_sla_vs_cost(rows, out / "sla_vs_gpu_hours.png", workload.name)
        print(f"   wrote {out}/", flush=True)
    return 0


def _write(
    out: Path, name: str, stats: dict, fleet: Any, tuned: dict, rows: list, runs: list, table: str, verdict: list[str]
) -> None:
    fleet_fields = {f.name: getattr(fleet, f.name) for f in dataclasses.fields(fleet)}
    (out / "summary.md").write_text(
        f"# {name}\n\n{stats['requests']} requests, {stats['duration_s']:.0f} s, {stats['rate_rps']:.2f} req/s, "
        f"mean prompt {stats['mean_prompt']:.0f}, mean output {stats['mean_output']:.0f} tokens\n\n"
        f"Fleet: `{json.dumps(fleet_fields)}`\n\nTuned variants: `{json.dumps(tuned)}`\n\n{table}\n\n"
        + "\n".join(f"- {line}" for line in verdict)
        + "\n"
    )
    (out / "summary.json").write_text(
        json.dumps(
            {
                "trace": name,
                "stats": stats,
                "fleet": fleet_fields,
                "tuned": tuned,
                "policies": [dataclasses.asdict(r) | {"wall_s": run.wall_s} for r, run in zip(rows, runs)],
            },
            indent=2,
            default=str,
        )
    )
