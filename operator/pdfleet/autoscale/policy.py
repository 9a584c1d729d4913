"""Pure per-pool scaling policy: HPA formula per signal, max over signals, stabilization, step limits, bounds.

Latency and queue are saturation signals, not proportional to load: they only scale up, a breach capped relative to
the capacity view; only the capacity signal (token demand vs per-replica capacity, configured, learned while saturated
or the timing model's prior) shrinks a pool. docs/autoscaling.md says why (fleet simulator runs).

No clocks and no I/O: the caller passes `now`, the pool's reading and the previous PoolScalerState, and gets a
Decision and the next state. The fleet-wide step (GPU budget, P:D ratio) is in `pdfleet.autoscale.fleet_decision`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping

from pdfleet.autoscale.config import PoolPolicyConfig
from pdfleet.autoscale.signals import MetricsUnavailable, PoolReading, PoolSignals
from pdfleet.perfmodel.replica import decode_sla_capacity, prefill_sla_capacity

CAPACITY_LEARN_WEIGHT = 0.3  # EWMA weight of a new capacity sample
# Share of a saturated replica's throughput that the learned capacity keeps: a replica serving at its saturated rate
# queues, and bursty arrivals need headroom to keep the latency tail inside the target.
LEARNED_CAPACITY_UTILIZATION = 0.5
# Most one latency or queue breach may ask for, as a multiple of the pool's measured size (the larger of the replicas
# reporting and the capacity recommendation): once a queue forms both grow without bound, so ceil(n x ratio) alone
# would jump to maxReplicas.
LATENCY_BREACH_MAX_GROWTH = 1.5
_EPS = 1e-9  # float slack so ceil(3.0000000001) stays 3


@dataclass(frozen=True)
class Recommendation:
    """A raw (pre-stabilization) replica recommendation made at `at` (seconds)."""

    at: float
    replicas: int


@dataclass(frozen=True)
class PoolScalerState:
    """What the policy remembers between intervals for one pool."""

    recommendations: tuple[Recommendation, ...] = ()
    last_scale_at: float | None = None
    learned_capacity_tps: float | None = None


def fresh_state(current: int, now: float) -> PoolScalerState:
    """State for a pool seen for the first time (or after an operator restart): the current size counts as a
    recommendation, so the scale-down window starts now instead of allowing an immediate shrink."""
    return PoolScalerState(recommendations=(Recommendation(now, current),))


@dataclass(frozen=True)
class SignalEstimate:
    """One signal's HPA recommendation: `ratio` is observed/target adjusted for missing replicas."""

    name: str  # "latency" | "queue" | "capacity"
    ratio: float
    replicas: int
    need: int  # what the reporting replicas' reading alone calls for: ceil(reporting x observed / target)
    text: str  # e.g. "TTFT p90 812 ms > 500 ms"
    recommends: bool = True  # False: reported but takes no part in the max (latency below target)


@dataclass(frozen=True)
class Decision:
    """The replica count chosen for one pool, why, and the values it was based on."""

    pool: str
    current: int
    desired: int
    driving_signal: str | None  # "latency" | "queue" | "capacity"; None when holding
    cause: str  # what the driving signal saw, e.g. "TTFT p90 812 ms > 500 ms"
    signals: Mapping[str, float]
    notes: tuple[str, ...] = ()  # each constraint that moved the result (stabilization, steps, bounds, fleet)
    pressure: float = 0.0  # largest observed/target ratio over the signals; the fleet step's priority
    held: bool = False  # True when the pool keeps its size for lack of metrics

    @property
    def reason(self) -> str:
        """One line for events and logs, e.g. "prefill 2\u21924: TTFT p90 812 ms > 500 ms"."""
        return "; ".join([f"{self.pool} {self.current}\u2192{self.desired}: {self.cause}", *self.notes])


def _ceil(value: float) -> int:
    return max(0, math.ceil(value - _EPS))


def _replica_adjusted_ratio(ratio: float, reporting: int, current: int) -> float:
    """HPA's treatment of replicas without metrics: 0 of target when scaling up, 100 % when scaling down."""
    if reporting >= current or current <= 0:
        return ratio
    missing = current - reporting
    if ratio > 1.0:
        return reporting * ratio / current
    return (reporting * ratio + missing) / current


def _comparison(ratio: float, tolerance: float) -> str:
    if ratio > 1.0 + tolerance:
        return ">"
    if ratio < 1.0 - tolerance:
        return "<"
    return "\u2248"


def _estimate(
    name: str, raw_ratio: float, reporting: int, current: int, tolerance: float, describe: str
) -> SignalEstimate:
    """HPA formula desired = ceil(current * ratio), with the tolerance band and missing-replica adjustment."""
    ratio = _replica_adjusted_ratio(raw_ratio, reporting, current)
    base = max(current, 1)
    flipped = (raw_ratio > 1.0) != (ratio > 1.0)  # missing replicas turned the direction around: HPA holds
    if abs(ratio - 1.0) <= tolerance or flipped:
        replicas = current
    else:
        replicas = _ceil(base * ratio)
    need = _ceil(reporting * raw_ratio)
    return SignalEstimate(name, ratio, replicas, need, describe.replace("{cmp}", _comparison(ratio, tolerance)))


def _scale_up_only(
    estimate: SignalEstimate, raw_ratio: float, current: int, config: PoolPolicyConfig
) -> SignalEstimate:
    """A saturation signal (latency, queue) is not proportional to load below its target, so there it recommends
    nothing: ceil(n x ratio) would shrink the pool toward saturation."""
    if raw_ratio < 1.0 - config.tolerance and not config.plain_hpa:
        return replace(estimate, replicas=current, recommends=False)
    return estimate


def _latency_ratio(config: PoolPolicyConfig, s: PoolSignals) -> float | None:
    """Observed/target latency of the pool (TTFT for prefill, ITL for decode); None without a value or target."""
    latency_s = s.ttft_p if config.pool == "prefill" else s.itl_p
    if latency_s is None or config.target_latency_ms <= 0:
        return None
    return latency_s * 1000.0 / config.target_latency_ms


def _latency_estimate(
    config: PoolPolicyConfig, s: PoolSignals, current: int, percentile: float
) -> SignalEstimate | None:
    """HPA formula on latency, scale-up only."""
    ratio = _latency_ratio(config, s)
    if ratio is None:
        return None
    label = "TTFT" if config.pool == "prefill" else "ITL"
    text = f"{label} p{percentile:g} {ratio * config.target_latency_ms:.0f} ms {{cmp}} {config.target_latency_ms:g} ms"
    return _scale_up_only(
        _estimate("latency", ratio, s.replicas_reporting, current, config.tolerance, text), ratio, current, config
    )


def _cap_breach(
    config: PoolPolicyConfig, estimate: SignalEstimate | None, s: PoolSignals, current: int, sized: int
) -> SignalEstimate | None:
    """A latency or queue breach asks for at most LATENCY_BREACH_MAX_GROWTH x the larger of the replicas reporting
    and `sized` (what the capacity reading calls for). Once work queues, both grow with time rather than with load,
    and more so while new replicas start: uncapped, a cold start under load asked for +4 replicas every interval
    until maxReplicas (simulator, conv x8 from its first minute's size). HPA mode keeps HPA's uncapped formula."""
    if estimate is None or config.plain_hpa or not estimate.recommends or estimate.ratio < 1.0:
        return estimate
    cap = max(current, _ceil(max(s.replicas_reporting, sized) * LATENCY_BREACH_MAX_GROWTH))
    if estimate.replicas > cap:
        return replace(estimate, replicas=cap, text=f"{estimate.text} (one breach adds at most to {cap})")
    return estimate


def _queue_estimate(config: PoolPolicyConfig, s: PoolSignals, current: int) -> SignalEstimate | None:
    per_replica = s.queue_per_replica
    if per_replica is None or config.target_queue_per_replica <= 0:
        return None
    text = f"queue {per_replica:.1f}/replica {{cmp}} {config.target_queue_per_replica:g}"
    ratio = per_replica / config.target_queue_per_replica
    return _scale_up_only(
        _estimate("queue", ratio, s.replicas_reporting, current, config.tolerance, text), ratio, current, config
    )


def _pool_tps(pool: str, s: PoolSignals) -> float | None:
    return s.prompt_tps if pool == "prefill" else s.gen_tps


def _demand_tps(pool: str, s: PoolSignals, window_s: float) -> float | None:
    """Token demand: current throughput plus the waiting requests' tokens drained over one window."""
    tps = _pool_tps(pool, s)
    if tps is None:
        return None
    if not s.queue_total or not s.request_rate or window_s <= 0:
        return tps
    tokens_per_request = tps / s.request_rate
    return tps + s.queue_total * tokens_per_request / window_s


def _capacity_estimate(
    config: PoolPolicyConfig, s: PoolSignals, current: int, capacity: float | None, window_s: float
) -> SignalEstimate | None:
    demand = _demand_tps(config.pool, s, window_s)
    if demand is None or not capacity or s.replicas_reporting <= 0:
        return None
    kind = "prompt" if config.pool == "prefill" else "generation"
    text = f"{kind} demand {demand:.0f} tok/s {{cmp}} {s.replicas_reporting} x {capacity:.0f} tok/s capacity"
    ratio = demand / (s.replicas_reporting * capacity)
    return _estimate("capacity", ratio, s.replicas_reporting, current, config.tolerance, text)


def learn_capacity(config: PoolPolicyConfig, s: PoolSignals, current: int, learned: float | None) -> float | None:
    """Fold a capacity sample into the EWMA while the pool is saturated (latency or queue per replica at or over its
    target) with every replica reporting; an unsaturated pool's throughput is only the load it was offered. The
    sample is LEARNED_CAPACITY_UTILIZATION of the per-replica throughput."""
    tps = _pool_tps(config.pool, s)
    if not tps or s.replicas_reporting < max(current, 1):
        return learned
    floor = 1.0 - config.tolerance
    latency = _latency_ratio(config, s)
    queue = s.queue_per_replica
    at_target = latency is not None and latency >= floor
    queueing = (
        queue is not None and config.target_queue_per_replica > 0 and (queue >= floor * config.target_queue_per_replica)
    )
    if not (at_target or queueing):
        return learned
    sample = tps / s.replicas_reporting * LEARNED_CAPACITY_UTILIZATION
    if learned is None:
        return sample
    return (1.0 - CAPACITY_LEARN_WEIGHT) * learned + CAPACITY_LEARN_WEIGHT * sample


def prior_capacity(config: PoolPolicyConfig, s: PoolSignals) -> float | None:
    """Per-replica capacity at the SLA from the timing model at the reading's mean prompt and output lengths; None
    without a replica model, a request rate or token rates."""
    if config.replica_model is None or not s.request_rate or s.prompt_tps is None:
        return None
    isl = s.prompt_tps / s.request_rate
    if config.pool == "prefill":
        return prefill_sla_capacity(config.replica_model, isl)
    if s.gen_tps is None or config.target_latency_ms <= 0:
        return None
    return decode_sla_capacity(config.replica_model, config.target_latency_ms, isl, s.gen_tps / s.request_rate)


def signal_values(s: PoolSignals, percentile: float, capacity: float | None) -> dict[str, float]:
    """The reading as a flat {name: value} dict (latencies in ms) for Decision.signals; None values left out."""
    p = f"p{percentile:g}"
    values: dict[str, float | None] = {
        f"ttft_{p}_ms": None if s.ttft_p is None else s.ttft_p * 1000.0,
        f"itl_{p}_ms": None if s.itl_p is None else s.itl_p * 1000.0,
        "queue_total": s.queue_total,
        "queue_per_replica": s.queue_per_replica,
        "running_total": s.running_total,
        "kv_usage": s.kv_usage,
        "prompt_tps": s.prompt_tps,
        "gen_tps": s.gen_tps,
        "request_rate": s.request_rate,
        "replicas_reporting": float(s.replicas_reporting),
        "capacity_tps_per_replica": capacity,
    }
    return {name: value for name, value in values.items() if value is not None}


def _stabilize(
    config: PoolPolicyConfig, current: int, raw: int, history: tuple[Recommendation, ...], now: float
) -> int:
    """HPA stabilization: up to the min recommendation of the up-window, down to the max of the down-window."""
    up = [r.replicas for r in history if r.at > now - config.scale_up_stabilization_s] + [raw]
    down = [r.replicas for r in history if r.at > now - config.scale_down_stabilization_s] + [raw]
    return min(max(current, min(up)), max(down))


def _clamp(config: PoolPolicyConfig, replicas: int) -> int:
    return min(max(replicas, config.min_replicas), config.max_replicas)


def _limit_and_clamp(config: PoolPolicyConfig, current: int, stabilized: int, raw: int) -> tuple[int, list[str]]:
    """Apply the step limits then the bounds; return the result and a note per constraint that changed it."""
    notes: list[str] = []
    if stabilized > raw:
        notes.append(f"scale-down stabilization keeps {stabilized} (max over {config.scale_down_stabilization_s:g} s)")
    elif stabilized < raw:
        notes.append(f"scale-up stabilization holds {stabilized} (min over {config.scale_up_stabilization_s:g} s)")
    desired = stabilized
    if config.max_scale_up_step > 0 and desired > current + config.max_scale_up_step:
        desired = current + config.max_scale_up_step
        notes.append(f"maxScaleUpStep {config.max_scale_up_step} limits to {desired}")
    if config.max_scale_down_step > 0 and desired < current - config.max_scale_down_step:
        desired = current - config.max_scale_down_step
        notes.append(f"maxScaleDownStep {config.max_scale_down_step} limits to {desired}")
    clamped = _clamp(config, desired)
    if clamped != desired:
        bound = "maxReplicas" if clamped < desired else "minReplicas"
        notes.append(f"clamped to {bound} {clamped}")
    return clamped, notes


def _hold_decision(config: PoolPolicyConfig, current: int, cause: str, values: Mapping[str, float]) -> Decision:
    """Keep the current size (only brought back inside [min, max])."""
    desired = _clamp(config, current)
    notes: tuple[str, ...] = ()
    if desired != current:
        notes = (f"clamped to {'maxReplicas' if desired < current else 'minReplicas'} {desired}",)
    return Decision(config.pool, current, desired, None, cause, values, notes=notes, held=True)


def decide_pool(
    config: PoolPolicyConfig,
    current: int,
    reading: PoolReading,
    state: PoolScalerState,
    now: float,
    percentile: float = 90.0,
    window_s: float = 60.0,
) -> tuple[Decision, PoolScalerState]:
    """One pool's decision at `now` from its reading and previous state; returns the decision and the next state."""
    if not config.enabled:
        decision = Decision(config.pool, current, current, None, "autoscaling disabled", {})
        return decision, state
    if isinstance(reading, MetricsUnavailable):
        cause = f"holding, metrics unavailable ({reading.reason}: {reading.message})"
        return _hold_decision(config, current, cause, {}), state

    # a configured capacity is authoritative; else the learned one (this reading's sample counts at once), else the
    # timing model's prior until the pool first saturates
    learned = state.learned_capacity_tps
    capacity = config.capacity_tokens_per_s
    if capacity is None and not config.plain_hpa:
        learned = learn_capacity(config, reading, current, learned)
        capacity = learned or prior_capacity(config, reading)
    values = signal_values(reading, percentile, capacity)
    sized = _capacity_estimate(config, reading, current, capacity, window_s)
    breaches = (_latency_estimate(config, reading, current, percentile), _queue_estimate(config, reading, current))
    capped = [_cap_breach(config, e, reading, current, sized.need if sized else 0) for e in breaches]
    estimates = [e for e in (*capped, sized) if e is not None]
    if not estimates:
        decision = _hold_decision(config, current, "holding, no usable signal in the reading", values)
        return decision, replace(state, learned_capacity_tps=learned)

    # most replicas wins, then the larger ratio, then the first listed (latency, queue, capacity); a latency below
    # target drives only when it is the sole signal, and then holds
    driving = max([e for e in estimates if e.recommends] or estimates, key=lambda e: (e.replicas, e.ratio))
    raw = driving.replicas
    stabilized = _stabilize(config, current, raw, state.recommendations, now)
    desired, notes = _limit_and_clamp(config, current, stabilized, raw)
    cause = driving.text + (" (within tolerance)" if abs(driving.ratio - 1.0) <= config.tolerance else "")
    if not driving.recommends:
        cause += " (latency alone never scales down)"
    if 0 < reading.replicas_reporting < current:
        cause += f" ({reading.replicas_reporting} of {current} replicas reporting)"
    window = max(config.scale_up_stabilization_s, config.scale_down_stabilization_s)
    history = tuple(r for r in state.recommendations if r.at > now - window) + (Recommendation(now, raw),)
    decision = Decision(
        pool=config.pool,
        current=current,
        desired=desired,
        driving_signal=driving.name,
        cause=cause,
        signals=values,
        notes=tuple(notes),
        pressure=max(e.ratio for e in estimates),
    )
    next_state = PoolScalerState(
        recommendations=history,
        last_scale_at=now if desired != current else state.last_scale_at,
        learned_capacity_tps=learned,
    )
    return decision, next_state
