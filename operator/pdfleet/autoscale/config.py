"""The autoscaler's own view of its configuration: small frozen dataclasses, decoupled from the API model.

`policy_config_from_spec` maps a `pdfleet.api.model.PDDeploymentSpec` (snake_case attributes) onto them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from pdfleet.perfmodel.replica import ReplicaModel, pool_replica_model


@dataclass(frozen=True)
class PoolPolicyConfig:
    """Scaling settings of one pool (spec.<pool>.autoscaling plus what the policy needs around it)."""

    pool: str  # "prefill" | "decode"
    enabled: bool = True
    min_replicas: int = 1
    max_replicas: int = 8
    target_latency_ms: float = 500.0  # TTFT target (prefill) / TPOT target (decode) at `percentile`
    target_queue_per_replica: float = 4.0  # <= 0 disables the queue signal
    tolerance: float = 0.1
    scale_up_stabilization_s: float = 0.0
    scale_down_stabilization_s: float = 300.0
    max_scale_up_step: int = 4  # 0 = unlimited
    max_scale_down_step: int = 1  # 0 = unlimited
    gpus_per_replica: int = 1
    # tokens/s one replica sustains at the SLA (prompt tokens for prefill, generated tokens for decode); None = learn
    # it while the pool is saturated
    capacity_tokens_per_s: float | None = None
    # the timing model of one replica (model and GPU presets known): the capacity prior until some is learned
    replica_model: ReplicaModel | None = None
    # True = plain HPA (the simulator's hpa-queue baseline): latency and queue below target recommend ceil(n x ratio)
    # too, and no capacity is learned
    plain_hpa: bool = False


@dataclass(frozen=True)
class FleetPolicyConfig:
    """Settings shared by both pools (spec.autoscaler, spec.sla, spec.engine.kind)."""

    prefill: PoolPolicyConfig
    decode: PoolPolicyConfig
    percentile: float = 90.0
    interval_s: float = 15.0
    window_s: float = 60.0
    drain_timeout_s: float = 120.0
    gpu_budget: int | None = None
    pd_ratio_min: float | None = None  # prefill/decode replica ratio band
    pd_ratio_max: float | None = None
    engine_kind: str = "vllm"

    def pool(self, name: str) -> PoolPolicyConfig:
        """The PoolPolicyConfig of `name`."""
        if name == "prefill":
            return self.prefill
        if name == "decode":
            return self.decode
        raise KeyError(f"unknown pool {name!r}")


def _pool_config(spec: Any, pool: str, default_capacity: float | None) -> PoolPolicyConfig:
    pool_spec = spec.pool(pool)
    scaling = pool_spec.autoscaling
    capacity = scaling.capacity_tokens_per_second or default_capacity
    return PoolPolicyConfig(
        pool=pool,
        enabled=scaling.enabled,
        min_replicas=scaling.min_replicas,
        max_replicas=scaling.max_replicas,
        target_latency_ms=spec.target_latency_ms(pool),
        target_queue_per_replica=scaling.target_queue_depth_per_replica,
        tolerance=scaling.tolerance,
        scale_up_stabilization_s=scaling.scale_up_stabilization_seconds,
        scale_down_stabilization_s=scaling.scale_down_stabilization_seconds,
        max_scale_up_step=scaling.max_scale_up_step,
        max_scale_down_step=scaling.max_scale_down_step,
        gpus_per_replica=pool_spec.gpus_per_replica,
        capacity_tokens_per_s=capacity,
        replica_model=pool_replica_model(spec, pool),
    )


def policy_config_from_spec(spec: Any, capacity_tokens_per_s: Mapping[str, float] | None = None) -> FleetPolicyConfig:
    """Map a PDDeploymentSpec onto FleetPolicyConfig.

    A pool's capacity signal uses `autoscaling.capacityTokensPerSecond` when set, else the caller's default from
    `capacity_tokens_per_s` ({pool: tokens/s per replica}, e.g. from an engine preset); pools with neither learn it,
    starting from the timing model's prior when the model and the pool's gpuProduct match presets.
    """
    capacities = capacity_tokens_per_s or {}
    ratio = spec.autoscaler.pd_ratio
    return FleetPolicyConfig(
        prefill=_pool_config(spec, "prefill", capacities.get("prefill")),
        decode=_pool_config(spec, "decode", capacities.get("decode")),
        percentile=spec.sla.percentile,
        interval_s=spec.autoscaler.interval_seconds,
        window_s=spec.autoscaler.window_seconds,
        drain_timeout_s=spec.autoscaler.drain_timeout_seconds,
        gpu_budget=spec.autoscaler.gpu_budget,
        pd_ratio_min=ratio.min if ratio is not None else None,
        pd_ratio_max=ratio.max if ratio is not None else None,
        engine_kind=spec.engine.kind,
    )
