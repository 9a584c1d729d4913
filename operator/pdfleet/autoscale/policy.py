"""Pure per-pool scaling policy: HPA formula per signal, max over signals, stabilization, step limits, bounds.

Latency and queue are saturation signals, not proportional to load: they only scale up, a breach capped relative to
the capacity view; only the capacity signal (token demand vs per-replica capacity, configured, learned while saturated
and raised while over-provisioned, or the timing model's prior) and a window without traffic shrink a pool. Latency
scales on the part replicas can remove: a request's floor (its own prefill, or a lone sequence's decode step, from the
timing model, corrected online) is subtracted, and a target under the floor is reported unattainable instead of adding
replicas. docs/autoscaling.md says why (fleet simulator runs).

No clocks and no I/O: the caller passes `now`, the pool's reading and the previous PoolScalerState, and gets a
Decision and the next state. The fleet-wide step (GPU budget, P:D ratio) is in `pdfleet.autoscale.fleet_decision`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping

from pdfleet.autoscale.config import PoolPolicyConfig
from pdfleet.autoscale.signals import MetricsUnavailable, PoolReading, PoolSignals
from pdfleet.perfmodel.replica import (
    PREFILL_UTILIZATION,
    decode_itl,
    decode_sla_capacity,
    longest_prefill_within,
    prefill_sla_capacity,
    prefill_throughput,
    prefill_ttft,
)

CAPACITY_LEARN_WEIGHT = 0.3  # EWMA weight of a new capacity sample
# Share of a saturated replica's throughput that the learned capacity keeps: a replica serving at its saturated rate
# queues, and bursty arrivals need headroom to keep the latency tail inside the target.
LEARNED_CAPACITY_UTILIZATION = 0.5
# Most one latency or queue breach may ask for, as a multiple of the pool's measured size (the larger of the replicas
# reporting and the capacity recommendation): once a queue forms both grow without bound, so ceil(n x ratio) alone
# would jump to maxReplicas.
LATENCY_BREACH_MAX_GROWTH = 1.5
# Decode is bound by KV memory: a pool this full is at its capacity, whatever its latency
KV_SATURATION = 0.9
# The floor is learned only below this share of the replicas' modelled back-to-back prefill throughput, and a sample of
# observed / modelled TTFT over MAX_FLOOR_CORRECTION is queueing inside the window, not a floor: a log-normal prompt
# length's p90 with sigma 1 is 2.2x its mean's prefill (Azure code trace: contention samples of 11-17x had taught it a
# floor over its 500 ms target).
FLOOR_LEARN_MAX_UTILIZATION = 0.4
MAX_FLOOR_CORRECTION = 3.0
# Below this share of its replicas' modelled prefill throughput a prompt rarely waits for another: a TTFT over target
# there is the prompts' own tail, which the floor (a mean-length model times a learned correction) misses by more than
# a tight target leaves (held-out diurnal: read as queueing, prefill went from 3 to 63 replicas at 1 % utilization;
# 0.3 from a sweep on the Azure traces, docs/autoscaling.md).
LATENCY_BREACH_MIN_UTILIZATION = 0.3
# An over-provisioned pool raises its learned capacity: running at it with only this share of its latency headroom
# used (above the floor) says a replica sustains more; latency grows faster than load, so tokens/s over the share used
# (at least LEARNED_CAPACITY_UTILIZATION of it, so at most 2x per sample) is a conservative sample.
HEADROOM_LEARN_MAX_RATIO = 0.5
# A prefill pool allowed to reach zero replicas goes there while its prompts would take at most this share of the
# decode replicas' modelled prefill throughput: the router then serves every request whole on a decode (its direct
# path), and the prompts' chunks slow the decode steps by about that share. At zero it comes back once they take the
# share a prefill replica is sized at (PREFILL_UTILIZATION); the gap keeps it from flapping. 0.15, 0.3 and 0.35 were
# run on the held-out decode-heavy 8x trace (prompts at 20-31 % of two decodes, which alone served it within the SLA;
# at 0.3 two readings over it restarted the scale-down window), docs/autoscaling.md.
DIRECT_SERVING_MAX_SHARE = 0.35
DIRECT_SERVING_RETURN_SHARE = PREFILL_UTILIZATION
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
    # observed / modelled latency floor of the pool's requests, learned while nothing queues (None: the model's 1.0)
    floor_correction: float | None = None
    # whether the previous reading saw the pool saturated (None: no reading yet); see `decide_pool`
    saturated: bool | None = None


def fresh_state(current: int, now: float) -> PoolScalerState:
    """State for a pool seen for the first time (or after an operator restart): the current size counts as a
    recommendation, so the scale-down window starts now instead of allowing an immediate shrink."""
    return PoolScalerState(recommendations=(Recommendation(now, current),))


@dataclass(frozen=True)
class SignalEstimate:
    """One signal's HPA recommendation: `ratio` is observed/target adjusted for missing replicas."""

    name: str  # "latency" | "queue" | "capacity" | "idle" | "direct"
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
    driving_signal: str | None  # "latency" | "queue" | "capacity" | "idle" | "direct" (prefill at zero); None: holding
    cause: str  # what the driving signal saw, e.g. "TTFT p90 812 ms > 500 ms"
    signals: Mapping[str, float]
    notes: tuple[str, ...] = ()  # each constraint that moved the result (stabilization, steps, bounds, fleet)
    pressure: float = 0.0  # largest observed/target ratio over the signals; the fleet step's priority
    held: bool = False  # True when the pool keeps its size for lack of metrics
    unattainable: str = ""  # set when the latency target is below the requests' floor: no replica count meets it

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


def modelled_floor_s(config: PoolPolicyConfig, s: PoolSignals, percentile: float = 90.0) -> float | None:
    """The latency no replica count removes, from the timing model: for prefill, an idle replica's prefill of the
    percentile's prompt (tokens computed per request, cache hits excluded; the mean prompt when the engine does not
    export them): the percentile of the requests' own floors, as prefill time grows with the prompt; for decode, one
    sequence's step at the mean context. None without a model or traffic."""
    if config.replica_model is None or not s.request_rate or not s.prompt_tps:
        return None
    isl = s.prompt_tps / s.request_rate
    if config.pool == "prefill":
        tokens = s.prefill_tokens.quantile(percentile / 100.0) if s.prefill_tokens is not None else None
        return prefill_ttft(config.replica_model, tokens if tokens is not None else isl)
    osl = (s.gen_tps or 0.0) / s.request_rate
    return decode_itl(config.replica_model, 1, isl + osl / 2)


def prefill_utilization(config: PoolPolicyConfig, s: PoolSignals) -> float | None:
    """Prompt tokens/s over what the reporting prefill replicas sustain back to back at the reading's mean prompt (the
    timing model's); None for decode, or without a model, traffic or reporting replicas."""
    if config.pool != "prefill" or config.replica_model is None or s.replicas_reporting <= 0:
        return None
    if not s.request_rate or not s.prompt_tps:
        return None
    throughput = prefill_throughput(config.replica_model, s.prompt_tps / s.request_rate)
    return s.prompt_tps / (throughput * s.replicas_reporting)


def learn_floor_correction(
    config: PoolPolicyConfig, s: PoolSignals, current: int, learned: float | None, percentile: float = 90.0
) -> float | None:
    """Fold observed / modelled TTFT into the EWMA while the prefill pool queues nothing, runs at most one prompt per
    replica and its window's prompt tokens kept the replicas under FLOOR_LEARN_MAX_UTILIZATION of their modelled
    throughput: its TTFT percentile is then the requests' own prefill (the long-prompt tail included), not queueing.
    A sample over MAX_FLOOR_CORRECTION is dropped: the gauges are instantaneous, the percentile is the window's."""
    if config.pool != "prefill" or s.ttft_p is None or s.replicas_reporting < max(current, 1):
        return learned
    if s.queue_total or (s.running_total or 0.0) > s.replicas_reporting:
        return learned
    modelled = modelled_floor_s(config, s, percentile)
    utilization = prefill_utilization(config, s)
    if not modelled or utilization is None or utilization > FLOOR_LEARN_MAX_UTILIZATION:
        return learned
    sample = s.ttft_p / modelled
    return learned if sample > MAX_FLOOR_CORRECTION else _ewma(learned, sample)


def _latency_estimate(
    config: PoolPolicyConfig, s: PoolSignals, current: int, percentile: float, floor_s: float | None
) -> SignalEstimate | None:
    """HPA formula on the latency above the floor (the queueing and contention replicas remove), scale-up only; a
    target at or under the floor, or a prefill pool under LATENCY_BREACH_MIN_UTILIZATION, recommends nothing (see
    `unattainable_text`)."""
    ratio = _latency_ratio(config, s)
    if ratio is None:
        return None
    label = "TTFT" if config.pool == "prefill" else "ITL"
    target = config.target_latency_ms
    observed = ratio * target
    text = f"{label} p{percentile:g} {observed:.0f} ms {{cmp}} {target:g} ms"
    if floor_s is not None and not config.plain_hpa:
        floor_ms = floor_s * 1000.0
        if floor_ms >= target:
            return SignalEstimate("latency", 0.0, current, current, text.replace("{cmp}", ">"), False)
        ratio = max(0.0, observed - floor_ms) / (target - floor_ms)
        text = f"{label} p{percentile:g} {observed:.0f} ms, {observed - floor_ms:.0f} ms over its {floor_ms:.0f} ms "
        text += f"floor {{cmp}} {target - floor_ms:.0f} ms"
        utilization = prefill_utilization(config, s)
        if ratio > 1.0 and utilization is not None and utilization < LATENCY_BREACH_MIN_UTILIZATION:
            text += f" at {utilization:.0%} utilization: the prompts' own tail, not queueing"
            return SignalEstimate("latency", 0.0, current, current, text.replace("{cmp}", ">"), False)
        if ratio > 1.0 and observed <= target * (1.0 + config.tolerance):
            # the latency itself is within HPA's tolerance of its target: a floor close to the target must not turn
            # a few ms of jitter into replicas (held-out bursty: 521 ms against 500 ms read as 1.3x)
            text += f" ({observed:.0f} ms within {config.tolerance:.0%} of {target:g} ms)"
            return SignalEstimate("latency", observed / target, current, current, text.replace("{cmp}", ">"), False)
    return _scale_up_only(
        _estimate("latency", ratio, s.replicas_reporting, current, config.tolerance, text), ratio, current, config
    )


def unattainable_text(config: PoolPolicyConfig, floor_s: float | None, percentile: float) -> str:
    """Why no replica count meets the pool's latency target, or "" when one can."""
    if floor_s is None or config.plain_hpa or config.target_latency_ms <= 0:
        return ""
    floor_ms = floor_s * 1000.0
    if floor_ms < config.target_latency_ms:
        return ""
    label = "TTFT" if config.pool == "prefill" else "ITL"
    return (
        f"{label} p{percentile:g} target {config.target_latency_ms:g} ms is below the requests' own floor "
        f"{floor_ms:.0f} ms on an idle replica: no replica count meets it (raise the target or use faster hardware)"
    )


def unattainable_share(config: PoolPolicyConfig, s: PoolSignals) -> float | None:
    """Share (0..1) of the window's prefill requests whose own prefill on an idle replica (the timing model's) is
    over the TTFT target: no replica count serves them within it. Not scaled by the learned floor correction, which
    also absorbs the contention of a busy replica (over 2x on the Azure conv trace's first minutes, where it would
    report 15 % of requests instead of under 1 %). None for decode, or without a model, a target or the engine's
    per-request prompt histogram."""
    if config.pool != "prefill" or config.replica_model is None or config.target_latency_ms <= 0:
        return None
    if s.prefill_tokens is None:
        return None
    longest = longest_prefill_within(config.replica_model, config.target_latency_ms / 1000.0)
    return s.prefill_tokens.share_above(longest)


def _idle_estimate(config: PoolPolicyConfig, s: PoolSignals, current: int) -> SignalEstimate | None:
    """No tokens, no queue and nothing running over the window: the pool may shrink to its minimum (after the
    scale-down stabilization), with or without a capacity to size it by."""
    latency = s.ttft_p if config.pool == "prefill" else s.itl_p
    if config.plain_hpa or s.replicas_reporting <= 0 or latency is not None or _pool_tps(config.pool, s) != 0.0:
        return None
    if s.queue_total != 0.0 or s.running_total != 0.0:
        return None
    return _estimate("idle", 0.0, s.replicas_reporting, current, config.tolerance, "no traffic in the window")


def _cap_breach(
    config: PoolPolicyConfig, estimate: SignalEstimate | None, s: PoolSignals, current: int, sized: int
) -> SignalEstimate | None:
    """A latency or queue breach asks for at most LATENCY_BREACH_MAX_GROWTH x the larger of the replicas reporting
    and `sized` (what the capacity reading calls for). Once work queues, both grow with time rather than with load,
    and more so while new replicas start: uncapped, a cold start under load asked for +4 replicas every interval
    until maxReplicas (simulator, conv x8 from its first minute's size). HPA mode keeps HPA's uncapped formula."""
    if estimate is None or config.plain_hpa or not estimate.recommends or estimate.ratio < 1.0:
        return estimate
    if 0 < s.replicas_reporting < current and estimate.replicas > max(current, sized):
        # the breach was measured without the replicas still starting: wait for them (Dynamo's planner also skips
        # a step while its last scaling completes); what the capacity reading calls for still applies
        cap = max(current, sized)
        return replace(
            estimate,
            replicas=cap,
            text=f"{estimate.text} (waiting for {current - s.replicas_reporting} "
            f"starting replicas before adding on a breach)",
        )
    cap = max(current, _ceil(max(s.replicas_reporting, sized) * LATENCY_BREACH_MAX_GROWTH))
    if estimate.replicas > cap:
        return replace(estimate, replicas=cap, text=f"{estimate.text} (one breach adds at most to {cap})")
    return estimate


def _queue_estimate(
    config: PoolPolicyConfig, s: PoolSignals, current: int, sized: SignalEstimate | None
) -> SignalEstimate | None:
    per_replica = s.queue_per_replica
    if per_replica is None or config.target_queue_per_replica <= 0:
        return None
    text = f"queue {per_replica:.1f}/replica {{cmp}} {config.target_queue_per_replica:g}"
    ratio = per_replica / config.target_queue_per_replica
    if ratio > 1.0 and config.pool == "decode" and not config.plain_hpa and _decode_has_room(config, s, sized):
        # vLLM counts a decode's requests still pulling their KV as waiting: with batch slots and KV to spare, they
        # wait on the transfer, which more replicas do not shorten
        text += f" with batch slots and KV cache ({s.kv_usage:.0%} used) for them: the requests wait on KV transfers"
        return SignalEstimate("queue", ratio, current, current, text.replace("{cmp}", ">"), False)
    return _scale_up_only(
        _estimate("queue", ratio, s.replicas_reporting, current, config.tolerance, text), ratio, current, config
    )


def _decode_has_room(config: PoolPolicyConfig, s: PoolSignals, sized: SignalEstimate | None) -> bool:
    """A decode pool that could admit its waiting requests now: ITL under its target, fewer sequences running per
    replica than --max-num-seqs, free KV cache for the waiting requests' prompts and outputs at the window's mean
    lengths, and generation demand under its capacity (`sized`). False when any of them is unknown (no model, no
    reading, no traffic, no capacity)."""
    if sized is None or sized.ratio >= 1.0 - config.tolerance:
        return False
    latency = _latency_ratio(config, s)
    replica = config.replica_model
    if replica is None or s.kv_usage is None or s.running_total is None or s.replicas_reporting <= 0:
        return False
    if not s.request_rate or s.prompt_tps is None or s.gen_tps is None or s.queue_per_replica is None:
        return False
    batch = s.running_total / s.replicas_reporting
    waiting_tokens = s.queue_per_replica * (s.prompt_tps + s.gen_tps) / s.request_rate
    return (
        (latency is None or latency < 1.0 - config.tolerance)
        and batch < replica.max_num_seqs * (1.0 - config.tolerance)
        and (1.0 - s.kv_usage) * replica.kv_capacity_tokens >= waiting_tokens
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


def learn_capacity(
    config: PoolPolicyConfig, s: PoolSignals, current: int, learned: float | None, latency_ratio: float | None
) -> float | None:
    """Fold a capacity sample into the EWMA while the pool is saturated, with every replica reporting; an
    unsaturated pool's throughput is only the load it was offered. `latency_ratio` is the latency above its floor
    over the target's (a latency stuck over an unattainable target is no saturation).

    Prefill (compute bound) is saturated when its latency or queue is at target, and keeps
    LEARNED_CAPACITY_UTILIZATION of the per-replica throughput as headroom for bursts. Decode (KV-memory bound) is
    saturated when its ITL is at target or its KV cache is KV_SATURATION full, and keeps all of it: a queue burst on
    decode (KV pulls waiting) says nothing of its capacity, and the prefill's derating made it hold 3x the replicas.

    Either pool with its latency under HEADROOM_LEARN_MAX_RATIO of the headroom above its floor is over-provisioned
    for its learned capacity when its tokens/s per replica over that share beat it: an early burst's sample (a queue at
    once, tokens/s over a window that began quiet: 1/4 of the modelled capacity) otherwise held it too large for good.
    This learns only upward, by at most 2x the per-replica rate a sample (see `_headroom_sample`)."""
    tps = _pool_tps(config.pool, s)
    if not tps or s.replicas_reporting < max(current, 1):
        return learned
    if not pool_saturated(config, s, latency_ratio):
        headroom = _headroom_sample(tps, s.replicas_reporting, learned, latency_ratio)
        return learned if headroom is None else _ewma(learned, headroom)
    utilization = 1.0 if config.pool == "decode" else LEARNED_CAPACITY_UTILIZATION
    return _ewma(learned, tps / s.replicas_reporting * utilization)


def pool_saturated(config: PoolPolicyConfig, s: PoolSignals, latency_ratio: float | None) -> bool:
    """Is the pool at its capacity: latency above its floor at target, or (prefill) the queue per replica at target,
    or (decode) the KV cache KV_SATURATION full? `latency_ratio` as in `learn_capacity`."""
    floor = 1.0 - config.tolerance
    if latency_ratio is not None and latency_ratio >= floor:
        return True
    if config.pool == "decode":
        return s.kv_usage is not None and s.kv_usage >= KV_SATURATION
    queue = s.queue_per_replica
    return (
        queue is not None and config.target_queue_per_replica > 0 and queue >= floor * config.target_queue_per_replica
    )


def _ewma(learned: float | None, sample: float) -> float:
    """The learned value with `sample` folded in at CAPACITY_LEARN_WEIGHT (the sample itself when nothing was)."""
    return sample if learned is None else (1.0 - CAPACITY_LEARN_WEIGHT) * learned + CAPACITY_LEARN_WEIGHT * sample


def _headroom_sample(tps: float, replicas: int, learned: float | None, latency_ratio: float | None) -> float | None:
    """The capacity a pool with latency headroom shows, when it beats the learned one: tokens/s per replica over the
    share of the headroom above its floor that `latency_ratio` says was used."""
    if learned is None or latency_ratio is None or latency_ratio >= HEADROOM_LEARN_MAX_RATIO:
        return None
    sample = tps / replicas / max(latency_ratio, LEARNED_CAPACITY_UTILIZATION)
    return sample if sample > learned else None


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
        "computed_tps": s.computed_tps,
        "gen_tps": s.gen_tps,
        "request_rate": s.request_rate,
        "replicas_reporting": float(s.replicas_reporting),
        "capacity_tps_per_replica": capacity,
    }
    return {name: value for name, value in values.items() if value is not None}


def direct_serving_estimate(
    prefill: PoolPolicyConfig,
    decode: PoolPolicyConfig,
    prefill_reading: PoolReading,
    decode_reading: PoolReading,
    current_prefill: int,
    percentile: float = 90.0,
) -> SignalEstimate | None:
    """Can the decode pool serve the prompts itself, so the prefill pool may be at zero? Only for a prefill pool
    autoscaled down to minReplicas 0, with a timing model of the decode replicas and their reading of the prompts
    they compute (vLLM's per-request histogram: the requests they serve whole).

    The prompts' work is the prompt tokens both pools compute, as a share of the decode replicas' back-to-back
    prefill throughput. It fits when the share is at most DIRECT_SERVING_MAX_SHARE, the decode ITL stays inside its
    target once the prefill pool's share of each second also goes to prompt chunks, the p`N` prompt's own prefill
    slowed by the whole share stays inside the TTFT target (at zero: the decodes' measured TTFT), and the decode KV
    cache and queue have room. Then the estimate asks for 0 replicas (it overrides the prefill pool's own signals:
    they measure a pool that need not exist). At zero, a share over DIRECT_SERVING_RETURN_SHARE, or a latency or
    room that no longer fits, asks for the prefill replicas the work needs. None when the rule does not apply (the
    pool's own signals decide)."""
    if not prefill.enabled or prefill.min_replicas > 0 or prefill.plain_hpa:
        return None
    if not isinstance(decode_reading, PoolSignals) or decode_reading.replicas_reporting <= 0:
        return None
    d = decode_reading
    weighable = decode.replica_model is not None and d.computed_tps is not None and d.prefill_tokens is not None
    if current_prefill > 0 and not (weighable and d.request_rate):
        return None
    if not d.request_rate:
        return SignalEstimate("direct", 0.0, 0, 0, "no traffic on the decodes")
    if not weighable:
        # prompts the decodes cannot weigh: a prefill replica again rather than every prompt on the decodes for good
        what = (
            "no timing model of the decode replicas"
            if decode.replica_model is None
            else "no decode reading of vllm:request_prefill_kv_computed_tokens"
        )
        return SignalEstimate("direct", 1.0, 1, 1, f"{what}: prefill replicas again")
    moved, prompts = 0.0, d.prefill_tokens  # the prefill pool's work, which zero replicas moves onto the decodes
    if current_prefill > 0:
        if not isinstance(prefill_reading, PoolSignals) or prefill_reading.computed_tps is None:
            return None
        moved = prefill_reading.computed_tps
        if prefill_reading.prefill_tokens is not None and prefill_reading.prefill_tokens.total > 0:
            prompts = prefill_reading.prefill_tokens  # the decodes' own reading is mostly pulled KV (0 computed)
    work = d.computed_tps + moved
    isl = max(work / d.request_rate, 1.0)
    capacity = d.replicas_reporting * prefill_throughput(decode.replica_model, isl)
    share, before = work / capacity, d.computed_tps / capacity
    # hysteresis: to reach zero the latencies must fit under target minus the tolerance; at zero, the decodes'
    # measured latencies must pass the target itself to bring prefill replicas back
    margin = 1.0 if current_prefill == 0 else 1.0 - decode.tolerance
    limits: list[str] = []
    # at zero an autoscaled decode pool answers its own ITL (more decodes also shrink the prompts' share): prefill
    # replicas for it would add a second start-up for the same breach (held-out decode-heavy 8x: both pools grew)
    itl_decides = current_prefill > 0 or not decode.enabled
    if itl_decides and d.itl_p is not None and decode.target_latency_ms > 0:
        itl_ms = d.itl_p * 1000.0 * (1.0 - before) / max(1.0 - share, _EPS)
        if itl_ms >= decode.target_latency_ms * margin:
            limits.append(f"ITL p{percentile:g} {itl_ms:.0f} ms")
    tokens = prompts.quantile(percentile / 100.0)
    ttft_ms = None if tokens is None else prefill_ttft(decode.replica_model, tokens) * 1000.0 / max(1.0 - share, _EPS)
    if current_prefill == 0 and d.ttft_p is not None:
        ttft_ms = d.ttft_p * 1000.0
    if ttft_ms is not None and prefill.target_latency_ms > 0:
        if ttft_ms >= prefill.target_latency_ms * (1.0 if current_prefill == 0 else 1.0 - prefill.tolerance):
            limits.append(f"TTFT p{percentile:g} {ttft_ms:.0f} ms")
    if d.kv_usage is not None and d.kv_usage >= KV_SATURATION:
        limits.append(f"decode KV cache {d.kv_usage:.0%} full")
    queue = d.queue_per_replica
    if queue is not None and decode.target_queue_per_replica > 0 and queue > decode.target_queue_per_replica:
        limits.append(f"decode queue {queue:.1f}/replica")
    text = f"prompts {work:.0f} tok/s are {share:.0%} of {d.replicas_reporting} decode replicas' prefill throughput"
    bound = DIRECT_SERVING_RETURN_SHARE if current_prefill == 0 else DIRECT_SERVING_MAX_SHARE
    if not limits and share <= bound:
        return SignalEstimate("direct", share, 0, 0, f"{text}: the decode pool serves them (router's direct path)")
    if current_prefill > 0:
        return None
    needed = max(1, _ceil(work / prefill_sla_capacity(prefill.replica_model or decode.replica_model, isl)))
    why = ", ".join(limits) if limits else f"over {bound:.0%}"
    return SignalEstimate("direct", share, needed, needed, f"{text} ({why}): prefill replicas again")


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
    direct: SignalEstimate | None = None,
) -> tuple[Decision, PoolScalerState]:
    """One pool's decision at `now` from its reading and previous state; returns the decision and the next state.
    `direct` (prefill only, `direct_serving_estimate`) replaces the pool's own signals when it asks for zero
    replicas or the pool is at zero."""
    if not config.enabled:
        decision = Decision(config.pool, current, current, None, "autoscaling disabled", {})
        return decision, state
    override = direct if direct is not None and (direct.replicas == 0 or current == 0) else None
    if isinstance(reading, MetricsUnavailable) and override is not None:
        return _conclude(config, current, [override], state, now, {"direct_serving_share": override.ratio}, 0, "")
    if isinstance(reading, MetricsUnavailable):
        cause = f"holding, metrics unavailable ({reading.reason}: {reading.message})"
        return _hold_decision(config, current, cause, {}), state

    observed = reading
    if config.pool == "prefill" and reading.computed_tps is not None:
        # a prefill's work is the prompt tokens it computes: prefix-cache hits cost it next to nothing
        reading = replace(reading, prompt_tps=reading.computed_tps)
    # the latency floor: the timing model's, corrected by what the pool showed while nothing queued
    correction = state.floor_correction
    if not config.plain_hpa:
        correction = learn_floor_correction(config, reading, current, correction, percentile)
    modelled = modelled_floor_s(config, reading, percentile)
    floor_s = None if modelled is None else modelled * (correction or 1.0)
    latency = _latency_estimate(config, reading, current, percentile, floor_s)
    unattainable = unattainable_text(config, floor_s, percentile)
    over_floor = None if config.plain_hpa else unattainable_share(config, reading)
    # a configured capacity is authoritative; else the learned one (this reading's sample counts at once), else the
    # timing model's prior until the pool first saturates
    learned, saturated = state.learned_capacity_tps, state.saturated
    capacity = config.capacity_tokens_per_s
    if capacity is None and not config.plain_hpa:
        above_floor = latency.ratio if latency is not None and not unattainable else None
        saturated = pool_saturated(config, reading, above_floor)
        # the first saturated reading after an unsaturated one averages a quiet start into its tokens/s (the rate is
        # the window's, the queue is now's): held-out bursty learned 1/4 of the modelled capacity from it
        if not (saturated and state.saturated is False):
            learned = learn_capacity(config, reading, current, learned, above_floor)
        capacity = learned or prior_capacity(config, reading)
    values = signal_values(observed, percentile, capacity)
    if floor_s is not None:
        values["latency_floor_ms"] = floor_s * 1000.0
        values["target_unattainable"] = 1.0 if unattainable else 0.0
    if over_floor is not None:
        values["unattainable_requests_ratio"] = over_floor
    sized = _capacity_estimate(config, reading, current, capacity, window_s)
    breaches = (latency, _queue_estimate(config, reading, current, sized))
    capped = [_cap_breach(config, e, reading, current, sized.need if sized else 0) for e in breaches]
    estimates = [e for e in (*capped, sized, _idle_estimate(config, reading, current)) if e is not None]
    if override is not None:
        estimates = [override]
        values["direct_serving_share"] = override.ratio
    if not estimates:
        decision = _hold_decision(config, current, "holding, no usable signal in the reading", values)
        return replace(decision, unattainable=unattainable), replace(
            state, learned_capacity_tps=learned, floor_correction=correction, saturated=saturated
        )

    state = replace(state, learned_capacity_tps=learned, floor_correction=correction, saturated=saturated)
    return _conclude(config, current, estimates, state, now, values, reading.replicas_reporting, unattainable)


def _conclude(
    config: PoolPolicyConfig,
    current: int,
    estimates: list[SignalEstimate],
    state: PoolScalerState,
    now: float,
    values: Mapping[str, float],
    reporting: int,
    unattainable: str,
) -> tuple[Decision, PoolScalerState]:
    """The decision from the signals' estimates: the driving one, stabilization, step limits and bounds."""
    # most replicas wins, then the larger ratio, then the first listed (latency, queue, capacity); a latency below
    # target drives only when it is the sole signal, and then holds
    driving = max([e for e in estimates if e.recommends] or estimates, key=lambda e: (e.replicas, e.ratio))
    raw = driving.replicas
    stabilized = _stabilize(config, current, raw, state.recommendations, now)
    desired, notes = _limit_and_clamp(config, current, stabilized, raw)
    cause = driving.text + (" (within tolerance)" if abs(driving.ratio - 1.0) <= config.tolerance else "")
    if not driving.recommends:
        cause += " (latency alone never scales down)"
    if 0 < reporting < current:
        cause += f" ({reporting} of {current} replicas reporting)"
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
        unattainable=unattainable,
    )
    next_state = replace(
        state, recommendations=history, last_scale_at=now if desired != current else state.last_scale_at
    )
    return decision, next_state
