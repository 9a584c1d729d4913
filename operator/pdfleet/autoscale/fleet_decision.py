"""Pure fleet-wide step over both pools: P:D ratio band and GPU budget on top of the per-pool decisions.

Precedence (strongest first): min/max bounds > GPU budget > P:D ratio band > per-pool recommendation. Under budget
pressure the budget is shared between the pools in proportion to the replicas each asks for (see `_fit_budget`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping

from pdfleet import POOLS
from pdfleet.autoscale.config import FleetPolicyConfig
from pdfleet.autoscale.policy import Decision, PoolScalerState, decide_pool, direct_serving_estimate
from pdfleet.autoscale.signals import PoolReading, PoolSignals

_EPS = 1e-9


@dataclass(frozen=True)
class FleetDecision:
    """Both pools' decisions after the fleet step, and the states to pass to the next interval."""

    decisions: Mapping[str, Decision]
    states: Mapping[str, PoolScalerState]

    @property
    def replicas(self) -> dict[str, int]:
        """{pool: desired replicas}."""
        return {pool: d.desired for pool, d in self.decisions.items()}


@dataclass(frozen=True)
class _Range:
    """Replica counts the fleet step may choose for a pool."""

    low: int
    high: int


def _ratio_ok(config: FleetPolicyConfig, prefill: int, decode: int) -> bool:
    """Is prefill/decode inside the configured band (an unset side is open)?"""
    if decode == 0:
        return prefill == 0 or config.pd_ratio_max is None
    ratio = prefill / decode
    above_min = config.pd_ratio_min is None or ratio >= config.pd_ratio_min - _EPS
    below_max = config.pd_ratio_max is None or ratio <= config.pd_ratio_max + _EPS
    return above_min and below_max


def _gpus(config: FleetPolicyConfig, prefill: int, decode: int) -> int:
    return prefill * config.prefill.gpus_per_replica + decode * config.decode.gpus_per_replica


def _lower_into_band(config: FleetPolicyConfig, p: int, d: int, rp: _Range, rd: _Range) -> tuple[int, int]:
    """Lower the over-represented pool into the ratio band (never raises, so never costs GPUs)."""
    if config.pd_ratio_max is not None and p > config.pd_ratio_max * d + _EPS:
        p = max(rp.low, math.floor(config.pd_ratio_max * d + _EPS))
    if config.pd_ratio_min is not None and p < config.pd_ratio_min * d - _EPS:
        d = max(rd.low, math.floor(p / config.pd_ratio_min + _EPS))
    return p, d


def _enforce_ratio(config: FleetPolicyConfig, p: int, d: int, rp: _Range, rd: _Range) -> tuple[int, int]:
    """Bring prefill/decode into the band: raise the under-represented pool first (protects the SLA), else lower."""
    if config.pd_ratio_max is not None and p > config.pd_ratio_max * d + _EPS:
        d = min(rd.high, max(d, math.ceil(p / config.pd_ratio_max - _EPS)))
    if config.pd_ratio_min is not None and p < config.pd_ratio_min * d - _EPS:
        p = min(rp.high, max(p, math.ceil(config.pd_ratio_min * d - _EPS)))
    return _lower_into_band(config, p, d, rp, rd)


def _fit_budget(
    config: FleetPolicyConfig,
    asked: Mapping[str, int],
    current: Mapping[str, int],
    low: Mapping[str, int],
    pressure: Mapping[str, float],
) -> tuple[int, int]:
    """Share the GPU budget in proportion to what each pool asks: fill from the floors, one replica at a time, to the
    pool with the smallest granted/asked share (ties: the higher pressure, then decode).

    Proportional, not winner-takes-all: trimming only the calmer pool starves it, its pressure rises past the other's
    next interval and the budget flips between the pools every interval (the simulator saw 8:1 <-> 1:8 flapping).
    A share within one replica per pool of the current split, using no more GPUs, keeps the current split: moving one
    replica across costs a start-up on one side for a rounding difference, and flaps the same way (6:3 <-> 5:4).
    """
    budget = config.gpu_budget
    if budget is None or _gpus(config, asked["prefill"], asked["decode"]) <= budget:
        return asked["prefill"], asked["decode"]
    granted = {pool: min(asked[pool], low[pool]) for pool in POOLS}
    gpus = {"prefill": config.prefill.gpus_per_replica, "decode": config.decode.gpus_per_replica}
    while True:
        used = _gpus(config, granted["prefill"], granted["decode"])
        open_pools = [pool for pool in POOLS if granted[pool] < asked[pool] and used + gpus[pool] <= budget]
        if not open_pools:
            break
        pool = min(open_pools, key=lambda q: (granted[q] / asked[q], -pressure[q], q != "decode"))
        granted[pool] += 1
    shared, kept = (granted["prefill"], granted["decode"]), (current["prefill"], current["decode"])
    near = all(abs(a - b) <= 1 for a, b in zip(shared, kept)) and all(c >= low[q] for q, c in zip(POOLS, kept))
    if near and _gpus(config, *shared) <= _gpus(config, *kept) <= budget:
        return kept
    return shared


def _range(config: FleetPolicyConfig, decision: Decision) -> _Range:
    """Autoscaled pools may move within their bounds; disabled or holding pools stay where they are."""
    pool = config.pool(decision.pool)
    if not pool.enabled or decision.held:
        return _Range(decision.desired, decision.desired)
    return _Range(pool.min_replicas, pool.max_replicas)


def _band_text(config: FleetPolicyConfig) -> str:
    low = "0" if config.pd_ratio_min is None else f"{config.pd_ratio_min:g}"
    high = "inf" if config.pd_ratio_max is None else f"{config.pd_ratio_max:g}"
    return f"P:D ratio band [{low}, {high}]"


def _note(before: int, after: int, pool: str, why: str) -> tuple[str, ...]:
    if after == before:
        return ()
    verb = "raises" if after > before else "trims"
    return (f"{why} {verb} {pool} to {after}",)


def apply_fleet_constraints(config: FleetPolicyConfig, decisions: Mapping[str, Decision]) -> dict[str, Decision]:
    """Apply the ratio band and the GPU budget to both pools' decisions; each change is added to the pool's notes."""
    prefill, decode = decisions["prefill"], decisions["decode"]
    rp, rd = _range(config, prefill), _range(config, decode)
    steps: list[tuple[str, tuple[int, int]]] = []
    p, d = prefill.desired, decode.desired
    if config.pd_ratio_min is not None or config.pd_ratio_max is not None:
        p, d = _enforce_ratio(config, p, d, rp, rd)
        steps.append((_band_text(config), (p, d)))
    if config.gpu_budget is not None:
        p, d = _fit_budget(
            config,
            {"prefill": p, "decode": d},
            {"prefill": prefill.current, "decode": decode.current},
            {"prefill": rp.low, "decode": rd.low},
            {"prefill": prefill.pressure, "decode": decode.pressure},
        )
        steps.append((f"GPU budget {config.gpu_budget}", (p, d)))
        p, d = _lower_into_band(config, p, d, rp, rd)
        steps.append((_band_text(config), (p, d)))
    notes: dict[str, tuple[str, ...]] = {"prefill": (), "decode": ()}
    before = (prefill.desired, decode.desired)
    for why, after in steps:
        notes["prefill"] += _note(before[0], after[0], "prefill", why)
        notes["decode"] += _note(before[1], after[1], "decode", why)
        before = after
    unmet: tuple[str, ...] = ()
    if config.gpu_budget is not None and _gpus(config, p, d) > config.gpu_budget:
        unmet += (f"GPU budget {config.gpu_budget} exceeded at the pools' floors",)
    if not _ratio_ok(config, p, d):
        unmet += (f"{_band_text(config)} unreachable within bounds and budget",)
    return {
        "prefill": replace(prefill, desired=p, notes=prefill.notes + notes["prefill"] + unmet),
        "decode": replace(decode, desired=d, notes=decode.notes + notes["decode"] + unmet),
    }


def decide_fleet(
    config: FleetPolicyConfig,
    current: Mapping[str, int],
    readings: Mapping[str, PoolReading],
    states: Mapping[str, PoolScalerState],
    now: float,
) -> FleetDecision:
    """Both pools' decisions at `now`: per-pool policy, then the fleet step; pure and deterministic."""
    decisions: dict[str, Decision] = {}
    next_states: dict[str, PoolScalerState] = {}
    direct = direct_serving_estimate(
        config.prefill, config.decode, readings["prefill"], readings["decode"], current["prefill"], config.percentile
    )
    for pool in POOLS:
        decisions[pool], next_states[pool] = decide_pool(
            config.pool(pool),
            current[pool],
            readings[pool],
            states.get(pool, PoolScalerState()),
            now,
            percentile=config.percentile,
            window_s=config.window_s,
            direct=direct if pool == "prefill" else None,
        )
    decode_reading = readings["decode"]
    if current["prefill"] == 0 and isinstance(decode_reading, PoolSignals) and decode_reading.ttft_p is not None:
        # with no prefill replica the decodes compute every prompt: theirs is the pool's TTFT (SLAMet, dashboards)
        ttft = {f"ttft_p{config.percentile:g}_ms": decode_reading.ttft_p * 1000.0}
        decisions["prefill"] = replace(decisions["prefill"], signals={**decisions["prefill"].signals, **ttft})
    final = apply_fleet_constraints(config, decisions)
    for pool, decision in final.items():
        changed = decision.desired != decision.current
        previous = states.get(pool, PoolScalerState()).last_scale_at
        next_states[pool] = replace(next_states[pool], last_scale_at=now if changed else previous)
    return FleetDecision(decisions=final, states=next_states)
