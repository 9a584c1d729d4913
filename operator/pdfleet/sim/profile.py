"""Offline profile of one instance from the timing model: what a pre-deployment profiling sweep would measure.

Used to size the static baselines, by the planner-style scaler (its interpolators) and to seed pdfleet's capacity
signal. Pure functions of the fleet config; results are cached per (config, rounded input).
"""

from __future__ import annotations

import math
from functools import lru_cache

from pdfleet.engine.timing import decode_step_time, prefill_time
from pdfleet.sim.config import FleetConfig
from pdfleet.sim.trace import TraceRequest

# Share of a replica's profiled capacity that still meets the SLA under bursty arrivals: prefill queues (TTFT tails
# grow fast past ~0.55 on the Azure conv trace), decode only loses batch slots (ITL stays within target).
PREFILL_UTILIZATION = 0.5
DECODE_UTILIZATION = 0.8
DEMAND_WINDOW_S = 60.0  # demand is measured per minute, like the traces' published peak/mean


def _bucket(tokens: float) -> int:
    """Round token counts to 64 so the caches stay small."""
    return max(64, int(round(tokens / 64.0)) * 64)


@lru_cache(maxsize=4096)
def _prefill_ttft(fleet: FleetConfig, isl: int) -> float:
    return prefill_time(fleet.hardware, isl, fleet.max_num_batched_tokens)


def prefill_ttft(fleet: FleetConfig, isl: float) -> float:
    """Seconds to prefill one prompt of `isl` tokens on an idle instance (the profiled TTFT)."""
    return _prefill_ttft(fleet, _bucket(isl))


def prefill_throughput(fleet: FleetConfig, isl: float) -> float:
    """Prompt tokens/s one instance sustains prefilling `isl`-token prompts back to back."""
    bucket = _bucket(isl)
    return bucket / _prefill_ttft(fleet, bucket)


def decode_itl(fleet: FleetConfig, batch: float, context: float) -> float:
    """Profiled inter-token latency at `batch` running sequences of `context` KV tokens each."""
    b = max(1, int(round(batch)))
    return decode_step_time(fleet.hardware, b, int(b * context))


@lru_cache(maxsize=4096)
def _best_decode(fleet: FleetConfig, itl_target_us: int, context: int) -> tuple[float, int]:
    itl_target = itl_target_us / 1e6
    cap = min(fleet.max_num_seqs, max(1, fleet.kv_capacity_tokens // max(1, context)))
    lo, hi = 1, cap
    if decode_itl(fleet, 1, context) > itl_target:
        return 1.0 / decode_itl(fleet, 1, context), 1  # even batch 1 misses: the best it can do
    while lo < hi:  # step time grows with batch: largest batch within the target
        mid = (lo + hi + 1) // 2
        if decode_itl(fleet, mid, context) <= itl_target:
            lo = mid
        else:
            hi = mid - 1
    return lo / decode_itl(fleet, lo, context), lo


def decode_capacity(fleet: FleetConfig, itl_target_s: float, context: float) -> float:
    """Most generated tokens/s one instance sustains with ITL <= target at `context` tokens per sequence."""
    return _best_decode(fleet, max(1, int(itl_target_s * 1e6)), _bucket(context))[0]


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
    """Tokens/s per replica at the SLA: prefill back-to-back throughput and decode throughput within the TPOT
    target, each derated to its utilization above."""
    return {"prefill": prefill_throughput(fleet, isl) * PREFILL_UTILIZATION,
            "decode": decode_capacity(fleet, fleet.tpot_ms / 1000.0, isl + osl / 2) * DECODE_UTILIZATION}


def static_sizes(fleet: FleetConfig, trace: list[TraceRequest]) -> dict[str, dict[str, int]]:
    """{"peak": replicas, "mean": replicas}: static provisioning for the busiest minute and for the average load."""
    isl, osl = mean_lengths(trace)
    capacity = sla_capacity(fleet, isl, osl)

    def need(prompt_tps: float, gen_tps: float) -> dict[str, int]:
        return {"prefill": max(1, math.ceil(prompt_tps / capacity["prefill"])),
                "decode": max(1, math.ceil(gen_tps / capacity["decode"]))}

    peak = {"prefill": 1, "decode": 1}
    for _, prompt_tps, gen_tps in demand_series(trace):
        minute = need(prompt_tps, gen_tps)
        peak = {pool: max(count, minute[pool]) for pool, count in peak.items()}
    duration = max(trace[-1].arrival, 1.0) if trace else 1.0
    mean = need(len(trace) * isl / duration, len(trace) * osl / duration)
    return {"peak": peak, "mean": mean}
