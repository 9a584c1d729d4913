"""Offline profile of one instance from the timing model: what a pre-deployment profiling sweep would measure.

Used to size the static baselines, by the planner-style scaler (its interpolators) and to seed pdfleet's capacity
signal. The computation is the autoscaler's capacity prior (`pdfleet.perfmodel.replica`) on the fleet's replica; these
are its fleet-config entry points.
"""

from __future__ import annotations

import math
from functools import lru_cache

from pdfleet.perfmodel import replica as prior
from pdfleet.perfmodel.replica import ReplicaModel
from pdfleet.sim.config import FleetConfig
from pdfleet.sim.trace import TraceRequest

DEMAND_WINDOW_S = 60.0  # demand is measured per minute, like the traces' published peak/mean


@lru_cache(maxsize=64)
def fleet_replica(fleet: FleetConfig) -> ReplicaModel:
    """The timing model's view of one of the fleet's instances, with its engine limits."""
    return ReplicaModel(fleet.hardware, fleet.max_num_seqs, fleet.max_num_batched_tokens, fleet.gpu_memory_utilization)


def prefill_ttft(fleet: FleetConfig, isl: float) -> float:
    """Seconds to prefill one prompt of `isl` tokens on an idle instance (the profiled TTFT)."""
    return prior.prefill_ttft(fleet_replica(fleet), isl)


def prefill_throughput(fleet: FleetConfig, isl: float) -> float:
    """Prompt tokens/s one instance sustains prefilling `isl`-token prompts back to back."""
    return prior.prefill_throughput(fleet_replica(fleet), isl)


def decode_itl(fleet: FleetConfig, batch: float, context: float) -> float:
    """Profiled inter-token latency at `batch` running sequences of `context` KV tokens each."""
    return prior.decode_itl(fleet_replica(fleet), batch, context)


def decode_capacity(fleet: FleetConfig, itl_target_s: float, context: float) -> float:
    """Most generated tokens/s one instance sustains with ITL <= target at `context` tokens per sequence."""
    return prior.decode_capacity(fleet_replica(fleet), itl_target_s, context)


def demand_series(trace: list[TraceRequest], window_s: float = DEMAND_WINDOW_S) -> list[tuple[float, float, float]]:
    """(requests/s, prompt tokens/s, generated tokens/s) per window of the trace, by arrival."""
    if not trace:
        return []
    count = int(trace[-1].arrival // window_s) + 1
    series = [[0.0, 0.0, 0.0] for _ in range(count)]
    for r in trace:
        row = series[int(r.arrival // window_s)]
        row[0] += 1
        row[1] += r.prompt_tokens
        row[2] += r.output_tokens
    return [(a / window_s, p / window_s, g / window_s) for a, p, g in series]


def mean_lengths(trace: list[TraceRequest]) -> tuple[float, float]:
    """(mean prompt tokens, mean output tokens) of a trace."""
    n = max(1, len(trace))
    return sum(r.prompt_tokens for r in trace) / n, sum(r.output_tokens for r in trace) / n


def sla_capacity(fleet: FleetConfig, isl: float, osl: float) -> dict[str, float]:
    """Tokens/s per replica at the fleet's SLA for mean lengths isl/osl (`pdfleet.perfmodel.replica.sla_capacity`)."""
    return prior.sla_capacity(fleet_replica(fleet), fleet.tpot_ms, isl, osl)


def static_sizes(fleet: FleetConfig, trace: list[TraceRequest]) -> dict[str, dict[str, int]]:
    """{"peak", "mean", "first": replicas}: provisioning for the busiest minute, the average load and the first minute
    (`FleetConfig.scaler_start=first`: a cold start when the load then ramps)."""
    isl, osl = mean_lengths(trace)
    capacity = sla_capacity(fleet, isl, osl)

    def need(prompt_tps: float, gen_tps: float) -> dict[str, int]:
        return {
            "prefill": max(1, math.ceil(prompt_tps / capacity["prefill"])),
            "decode": max(1, math.ceil(gen_tps / capacity["decode"])),
        }

    minutes = [need(prompt_tps, gen_tps) for _, prompt_tps, gen_tps in demand_series(trace)] or [need(0.0, 0.0)]
    peak = {pool: max(minute[pool] for minute in minutes) for pool in ("prefill", "decode")}
    duration = max(trace[-1].arrival, 1.0) if trace else 1.0
    mean = need(len(trace) * isl / duration, len(trace) * osl / duration)
    return {"peak": peak, "mean": mean, "first": minutes[0]}


def unattainable_requests(fleet: FleetConfig, trace: list[TraceRequest]) -> list[TraceRequest]:
    """Requests whose own prefill on an idle instance (no cache hit) takes longer than the fleet's TTFT target: no
    replica count serves them within the SLA."""
    return [r for r in trace if prefill_ttft(fleet, r.prompt_tokens) * 1000.0 > fleet.ttft_ms]
