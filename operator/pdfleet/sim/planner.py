"""A Dynamo-SLA-planner-style throughput scaler, modelled on NVIDIA Dynamo's planner design notes.

Every `interval_s` (Dynamo's default adjustment interval: 180 s) it reads the frontend's request count, mean input and
output lengths, mean TTFT and mean ITL over the interval; predicts the next interval with the constant predictor
(next = last); corrects the profile with prefill_correction = observed TTFT / profiled TTFT and decode_correction =
observed ITL / profiled ITL; and sizes each pool from profiled per-replica throughput:

    prefill = ceil(requests * ISL / interval * min(1, prefill_correction) / prefill_throughput(ISL))
    decode  = ceil(requests * OSL / interval / decode_throughput(ITL target / decode_correction, ISL + OSL / 2))

The profile is the same timing model the simulator runs (`pdfleet.sim.profile`), i.e. a perfect offline sweep.
Dynamo sizes each pool at 100 % of its profiled throughput; `prefill_utilization` / `decode_utilization` below 1 give
it headroom (a user derating the profile), to compare the planner with pdfleet at equal SLA attainment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pdfleet.sim.config import FleetConfig
from pdfleet.sim.core import FleetView
from pdfleet.sim.profile import decode_capacity, decode_itl, prefill_throughput, prefill_ttft

DYNAMO_ADJUSTMENT_INTERVAL_S = 180.0


@dataclass(frozen=True)
class PlannerObservation:
    """One interval as the frontend saw it."""

    requests: float
    isl: float
    osl: float
    ttft_s: float
    itl_s: float
    decode_batch: float  # mean running sequences per decode replica


@dataclass(frozen=True)
class PlannerCorrections:
    """Observed / profiled latency ratios."""

    prefill: float
    decode: float


def corrections(fleet: FleetConfig, obs: PlannerObservation) -> PlannerCorrections:
    """Correction factors from one interval; 1.0 when a side had nothing to measure."""
    expected_ttft = prefill_ttft(fleet, obs.isl) if obs.isl else 0.0
    expected_itl = decode_itl(fleet, obs.decode_batch, obs.isl + obs.osl / 2) if obs.decode_batch >= 1 else 0.0
    prefill = obs.ttft_s / expected_ttft if expected_ttft and obs.ttft_s else 1.0
    decode = obs.itl_s / expected_itl if expected_itl and obs.itl_s else 1.0
    return PlannerCorrections(prefill, decode)


def plan_replicas(
    fleet: FleetConfig,
    obs: PlannerObservation,
    corr: PlannerCorrections,
    interval_s: float,
    max_replicas: int,
    utilization: tuple[float, float] = (1.0, 1.0),
) -> dict[str, int]:
    """Replicas per pool for the next interval (constant load prediction); `utilization` = (prefill, decode) share of
    the profiled throughput a replica is sized for (Dynamo: 1.0 each)."""
    prompt_tps = obs.requests * obs.isl / interval_s * min(1.0, corr.prefill)
    prefill = math.ceil(prompt_tps / (prefill_throughput(fleet, obs.isl) * utilization[0]))
    itl_target = fleet.tpot_ms / 1000.0 / max(corr.decode, 1e-6)
    decode_tps = decode_capacity(fleet, itl_target, obs.isl + obs.osl / 2) * utilization[1]
    decode = math.ceil(obs.requests * obs.osl / interval_s / decode_tps)
    return {"prefill": min(max_replicas, max(1, prefill)), "decode": min(max_replicas, max(1, decode))}


@dataclass
class PlannerPolicy:
    """The planner as a simulator ScalingPolicy."""

    initial_replicas: dict[str, int]
    interval_s: float = DYNAMO_ADJUSTMENT_INTERVAL_S
    name: str = "planner"
    prefill_utilization: float = 1.0
    decode_utilization: float = 1.0
    history: list[tuple[float, PlannerCorrections]] = field(default_factory=list)

    def initial(self, fleet: FleetConfig) -> dict[str, int]:
        """Start where the autoscalers start (`FleetConfig.scaler_start`)."""
        return dict(self.initial_replicas)

    def notes(self) -> tuple[str, ...]:
        """The planner reports nothing beyond its numbers."""
        return ()

    def decide(self, now: float, view: FleetView) -> dict[str, int]:
        """One adjustment: observe the last interval, correct, size; hold when no request arrived."""
        window = view.client_window(now, self.interval_s)
        current = {pool: view.desired(pool) for pool in ("prefill", "decode")}
        if window["requests"] <= 0:
            return current
        obs = PlannerObservation(
            window["requests"], window["isl"], window["osl"], window["ttft"], window["itl"], window["decode_batch"]
        )
        corr = corrections(view.fleet, obs)
        self.history.append((now, corr))
        return plan_replicas(
            view.fleet,
            obs,
            corr,
            self.interval_s,
            view.fleet.max_replicas,
            (self.prefill_utilization, self.decode_utilization),
        )
