"""The scaling policies compared side by side, all as simulator ScalingPolicy objects.

- pdfleet: the operator's own policy code (`pdfleet.autoscale.fleet_decision.decide_fleet`) with the API's defaults.
- hpa-queue: the same HPA machinery with only the queue-depth signal and HPA's default behaviour (scale-up at most
  4 pods per period, scale-down unlimited after the 300 s stabilization window).
- static-peak / static-mean: fixed replica counts sized from the profile for the busiest minute / the average load.
- planner: a Dynamo-SLA-planner-style throughput scaler (`pdfleet.sim.planner`).
- colocated: no PD; static instances doing both phases, as many GPUs as static-peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from pdfleet import POOLS
from pdfleet.api.model import PDDeploymentSpec
from pdfleet.autoscale.config import FleetPolicyConfig, policy_config_from_spec
from pdfleet.autoscale.fleet_decision import decide_fleet
from pdfleet.autoscale.policy import PoolScalerState, Recommendation
from pdfleet.sim.config import FleetConfig
from pdfleet.sim.core import COLOCATED_POOL, FleetView, ScalingPolicy
from pdfleet.sim.planner import PlannerPolicy
from pdfleet.sim.profile import mean_lengths, sla_capacity, static_sizes
from pdfleet.sim.trace import TraceRequest

POLICY_NAMES = ("pdfleet", "static-peak", "static-mean", "hpa-queue", "planner", "colocated")
HPA_SCALE_UP_PODS = 4  # HPA's default scale-up policy: at most 4 pods (or 100 %) per 15 s period


@dataclass
class StaticPolicy:
    """Fixed replica counts."""

    name: str
    replicas: dict[str, int]
    interval_s: float | None = None

    def initial(self, fleet: FleetConfig) -> dict[str, int]:
        """The fixed counts."""
        return dict(self.replicas)

    def decide(self, now: float, view: FleetView) -> dict[str, int]:
        """Never called for a static policy (interval_s is None); returns the fixed counts."""
        return dict(self.replicas)

    def notes(self) -> tuple[str, ...]:
        """A static policy reports nothing."""
        return ()


@dataclass
class AutoscalerPolicy:
    """pdfleet's autoscaler (or a re-configuration of it) run on simulated Prometheus readings."""

    name: str
    config: FleetPolicyConfig
    initial_replicas: dict[str, int]
    states: dict[str, PoolScalerState] = field(default_factory=dict)
    # per pool: (intervals whose latency target was below the requests' floor, the last such reason)
    unattainable: dict[str, tuple[int, str]] = field(default_factory=dict)
    # per pool: every interval's share of requests over their own floor (the autoscaler's unattainable_requests_ratio)
    over_floor: dict[str, list[float]] = field(default_factory=dict)

    @property
    def interval_s(self) -> float:
        """The autoscaler's timer interval."""
        return self.config.interval_s

    def initial(self, fleet: FleetConfig) -> dict[str, int]:
        """Start at the given counts, as if the autoscaler had recommended them until the trace began."""
        self.states = {
            pool: PoolScalerState(recommendations=(Recommendation(0.0, count),))
            for pool, count in self.initial_replicas.items()
        }
        return dict(self.initial_replicas)

    def decide(self, now: float, view: FleetView) -> dict[str, int]:
        """One autoscaler interval: readings over the window, then the operator's decide_fleet."""
        readings = view.readings(now, self.config.window_s, self.config.percentile)
        current = {pool: view.desired(pool) for pool in ("prefill", "decode")}
        result = decide_fleet(self.config, current, readings, self.states, now)
        self.states = dict(result.states)
        for pool, decision in result.decisions.items():
            if decision.unattainable:
                count, _ = self.unattainable.get(pool, (0, ""))
                self.unattainable[pool] = (count + 1, decision.unattainable)
            if "unattainable_requests_ratio" in decision.signals:
                self.over_floor.setdefault(pool, []).append(decision.signals["unattainable_requests_ratio"])
        return result.replicas

    def notes(self) -> tuple[str, ...]:
        """The intervals in which a pool's latency target was out of reach of any replica count, and why; the share
        of requests the autoscaler reported over their own floor."""
        unattainable = tuple(
            f"{self.name}: {pool}: target unattainable in {count} intervals, e.g. {reason}"
            for pool, (count, reason) in sorted(self.unattainable.items())
        )
        over_floor = tuple(
            f"{self.name}: {pool}: requests over their own floor (no replica count serves them within target), as "
            f"the autoscaler read them: {sum(shares) / len(shares):.1%} on average, at most {max(shares):.1%}"
            for pool, shares in sorted(self.over_floor.items())
            if max(shares) > 0
        )
        return unattainable + over_floor


def _api_cache_dtype(kv_cache_dtype: str) -> str:
    """The kvTransfer.cacheDtype for a vLLM --kv-cache-dtype value (fp8 variants map to fp8, bf16/fp16 to auto)."""
    lowered = kv_cache_dtype.lower()
    return "fp8" if lowered.startswith("fp8") else "int8" if lowered == "int8" else "auto"


def pdfleet_config(fleet: FleetConfig, tuning: Mapping[str, Any] | None = None) -> FleetPolicyConfig:
    """FleetPolicyConfig from a PDDeployment with the API defaults, autoscaling on, bounds set by the racks.

    `tuning` overrides API fields by their wire names: AutoscalingSpec fields for both pools (e.g.
    {"maxScaleUpStep": 2}) or one ({"prefill.targetLatencyMs": 250, "decode.capacityTokensPerSecond": 6000}),
    AutoscalerSpec fields as {"autoscaler.intervalSeconds": 10}.
    """
    pools: dict[str, dict[str, Any]] = {p: {"enabled": True, "maxReplicas": fleet.max_replicas} for p in POOLS}
    autoscaler: dict[str, Any] = {}
    for key, value in (tuning or {}).items():
        scope, _, name = key.rpartition(".")
        if scope == "autoscaler":
            autoscaler[name] = value
        elif scope in POOLS:
            pools[scope][name] = value
        elif not scope:
            for settings in pools.values():
                settings[name] = value
        else:
            raise ValueError(f"unknown tuning key {key!r}")
    spec = PDDeploymentSpec.model_validate(
        {
            "model": {"name": fleet.model},
            # the engine args and GPU label the operator reads the capacity prior from, as a real PDDeployment sets them
            "engine": {
                "args": [
                    "--max-num-seqs",
                    str(fleet.max_num_seqs),
                    "--max-num-batched-tokens",
                    str(fleet.max_num_batched_tokens),
                    "--gpu-memory-utilization",
                    str(fleet.gpu_memory_utilization),
                ]
            },
            "kvTransfer": {"cacheDtype": _api_cache_dtype(fleet.kv_cache_dtype)},
            **{
                p: {"gpusPerReplica": fleet.gpus_per_replica, "gpuProduct": fleet.gpu, "autoscaling": pools[p]}
                for p in POOLS
            },
            "sla": {"ttftMs": fleet.ttft_ms, "tpotMs": fleet.tpot_ms, "percentile": fleet.percentile},
            "autoscaler": autoscaler,
        }
    )
    return policy_config_from_spec(spec)


def hpa_queue_config(fleet: FleetConfig) -> FleetPolicyConfig:
    """The operator's policy with only the queue signal and HPA's default scale-up/down behaviour."""
    base = pdfleet_config(fleet)
    only_queue = dict(
        min_replicas=1,  # HPA's default minReplicas (scale to zero is behind its HPAScaleToZero feature gate)
        target_latency_ms=0.0,
        capacity_tokens_per_s=None,
        max_scale_up_step=HPA_SCALE_UP_PODS,
        max_scale_down_step=0,
        plain_hpa=True,
    )
    return replace(base, prefill=replace(base.prefill, **only_queue), decode=replace(base.decode, **only_queue))


PLANNER_OPTIONS = {"prefillUtilization": "prefill_utilization", "decodeUtilization": "decode_utilization"}


def planner_options(tuning: Mapping[str, Any]) -> dict[str, float]:
    """PlannerPolicy fields from a planner variant's JSON: {"prefillUtilization": 0.4, "decodeUtilization": 0.8}."""
    unknown = sorted(set(tuning) - set(PLANNER_OPTIONS))
    if unknown:
        raise ValueError(f"unknown planner options {unknown}; known: {', '.join(PLANNER_OPTIONS)}")
    options = {PLANNER_OPTIONS[key]: float(value) for key, value in tuning.items()}
    if any(not 0.0 < value <= 1.0 for value in options.values()):
        raise ValueError(f"planner utilizations must be in (0, 1], got {tuning}")
    return options


def build_policy(
    name: str, fleet: FleetConfig, trace: list[TraceRequest], tuning: Mapping[str, Any] | None = None
) -> tuple[ScalingPolicy, FleetConfig]:
    """The named policy and the fleet it runs on (colocated runs the fleet with disaggregation off).

    `tuning` for "pdfleet*" names is pdfleet_config's, plus "seedCapacity": true to set each pool's
    capacityTokensPerSecond from the profile (profile.sla_capacity at the trace's mean lengths), as a user with a
    profiling run would; for "planner*" names, planner_options'.
    """
    sizes = static_sizes(fleet, trace)
    if name == "static-peak":
        return StaticPolicy(name, sizes["peak"]), fleet
    if name == "static-mean":
        return StaticPolicy(name, sizes["mean"]), fleet
    if name == "colocated":
        colocated = replace(fleet, disaggregated=False)
        return StaticPolicy(name, {COLOCATED_POOL: sum(sizes["peak"].values())}), colocated
    if name == "hpa-queue":
        return AutoscalerPolicy(name, hpa_queue_config(fleet), sizes[fleet.scaler_start]), fleet
    if name.startswith("planner"):
        return PlannerPolicy(sizes[fleet.scaler_start], **planner_options(tuning or {})), fleet
    if name.startswith("pdfleet"):
        options = dict(tuning or {})
        if options.pop("seedCapacity", False):
            profiled = sla_capacity(fleet, *mean_lengths(trace))
            options = {**{f"{pool}.capacityTokensPerSecond": profiled[pool] for pool in POOLS}, **options}
        return AutoscalerPolicy(name, pdfleet_config(fleet, options), sizes[fleet.scaler_start]), fleet
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")
