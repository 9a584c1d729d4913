"""Glue shared by `pdfleet simulate` and bench/sim_bench.py: load a workload, run named policies, time them."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pdfleet.sim.config import FleetConfig
from pdfleet.sim.core import SimResult, Simulation
from pdfleet.sim.policies import build_policy
from pdfleet.sim.trace import TraceRequest, add_shared_prefixes, read_trace, scale_load
from pdfleet.sim.workload import generate, parse_profile

SYNTHETIC_PREFIX = "synthetic:"


@dataclass(frozen=True)
class Workload:
    """A named trace, ready to simulate."""

    name: str
    requests: list[TraceRequest]


def load_workload(
    spec: str,
    load_scale: int = 1,
    seed: int = 0,
    limit: int | None = None,
    shared_prefixes: tuple[int, int, float] | None = None,
    prefix_block_tokens: int = 64,
    time_unit: str | None = None,
) -> Workload:
    """A trace file (CSV/JSONL) or 'synthetic:<profile>' (see workload.parse_profile), scaled and with prefixes.

    `shared_prefixes` is (groups, prefix tokens, share of requests), see trace.add_shared_prefixes; `time_unit` is
    the unit of a trace file's numeric arrivals where its format does not fix it (see trace.read_trace).
    """
    if spec.startswith(SYNTHETIC_PREFIX):
        profile_text = spec[len(SYNTHETIC_PREFIX) :]
        requests = generate(parse_profile(profile_text), seed)
        name = "synthetic-" + profile_text.partition(":")[0]
    else:
        requests = read_trace(spec, limit, time_unit, prefix_block_tokens)
        name = Path(spec).stem
    if limit is not None:
        requests = requests[:limit]
    if load_scale > 1:
        requests = scale_load(requests, load_scale, seed=seed)
        name += f"-x{load_scale}"
    if shared_prefixes:
        groups, tokens, share = shared_prefixes
        requests = add_shared_prefixes(requests, groups, tokens, share, prefix_block_tokens, seed)
    return Workload(name, requests)


@dataclass(frozen=True)
class TimedRun:
    """One policy's result and the wall time it took to simulate."""

    result: SimResult
    wall_s: float


def run_policy(
    name: str,
    fleet: FleetConfig,
    requests: list[TraceRequest],
    tuning: Mapping[str, Any] | None = None,
    label: str | None = None,
) -> TimedRun:
    """Simulate one named policy on a trace; `label` renames it in the result (e.g. a tuned variant)."""
    policy, policy_fleet = build_policy(name, fleet, requests, tuning)
    if label:
        policy.name = label
    start = time.perf_counter()
    result = Simulation(policy_fleet, requests, policy).run()
    return TimedRun(result, time.perf_counter() - start)
