"""`pdfleet autoscaler`: print the autoscaler's PromQL, or read one PDDeployment's signals from Prometheus."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from typing import Any

from pdfleet.autoscale.promql import ENGINE_METRICS, fleet_queries
from pdfleet.autoscale.signals import PoolReading, PoolSignals, PrometheusSignalSource
from pdfleet.cli.argtypes import CommandParser, percentile, positive_float, positive_int


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="pdfleet autoscaler", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_ in (("promql", "print every query of one interval"), ("signals", "query Prometheus once")):
        command = commands.add_parser(name, help=help_)
        command.add_argument("--namespace", required=True, help="the PDDeployment's namespace")
        command.add_argument("--pdd", required=True, help="PDDeployment name")
        command.add_argument(
            "--engine", default="vllm", choices=sorted(ENGINE_METRICS), help="engine kind (its metric names)"
        )
        command.add_argument("--window", type=positive_int, default=60, help="rate/quantile window, seconds")
        command.add_argument("--percentile", type=percentile, default=90, help="latency percentile (sla.percentile)")
    commands.choices["signals"].add_argument("--prometheus", required=True, help="Prometheus base URL")
    commands.choices["signals"].add_argument(
        "--timeout", type=positive_float, default=5.0, help="per-query timeout, seconds"
    )
    return parser


def _as_json(reading: PoolReading) -> dict[str, Any]:
    """A reading as strict JSON: histogram buckets keyed by their bound as Prometheus writes `le` ("+Inf")."""
    fields = {"type": type(reading).__name__, **dataclasses.asdict(reading)}
    if isinstance(reading, PoolSignals) and reading.prefill_tokens is not None:
        fields["prefill_tokens"] = {
            ("+Inf" if math.isinf(bound) else f"{bound:g}"): rate for bound, rate in reading.prefill_tokens.buckets
        }
    return fields


def main(argv: list[str]) -> int:
    """Entry point of `pdfleet autoscaler`."""
    args = _parser().parse_args(argv)
    if args.command == "promql":
        for query in fleet_queries(args.engine, args.namespace, args.pdd, args.window, args.percentile):
            print(f"# {query.signal.value} ({query.unit}): {query.doc}\n{query.promql}\n")
        return 0
    source = PrometheusSignalSource(args.prometheus, timeout_seconds=args.timeout)
    try:
        readings = source.fetch(args.engine, args.namespace, args.pdd, args.window, args.percentile, at=time.time())
    finally:
        source.close()
    print(json.dumps({pool: _as_json(r) for pool, r in readings.items()}, indent=2))
    return 0 if all(isinstance(r, PoolSignals) for r in readings.values()) else 1
