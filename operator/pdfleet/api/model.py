"""The `PDDeployment` API (pdfleet.dev/v1alpha1): pydantic v2 models of spec and status, and spec parsing.

Field names are snake_case in Python and camelCase on the wire. Field descriptions become the CRD's descriptions, so
they are written for users. Defaults and semantics follow docs/architecture.md.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel

from pdfleet import POOLS

PoolName = Literal["prefill", "decode"]
GPU_RESOURCE = "nvidia.com/gpu"

# Kubernetes label key: optional DNS-subdomain prefix, then a name segment of at most 63 characters.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"
QUANTITY_PATTERN = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkKMGTPE]|[KMGTPE]i)?$"
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# One UCX transport name (UCX_TLS item), optionally negated with a leading ^ (e.g. tcp, sm, cuda_copy, ^cuda_ipc).
UCX_TRANSPORT_PATTERN = r"^\^?[a-z][a-z0-9_]*$"
# One UCX network device (UCX_NET_DEVICES item): an interface or HCA port (e.g. eth0, lo, mlx5_0:1) or "all".
UCX_DEVICE_PATTERN = r"^[A-Za-z0-9][-A-Za-z0-9_.]*(:[0-9]+)?$"
# vLLM's defaults (vllm/envs.py) for the ports its KV connectors listen on.
DEFAULT_NIXL_SIDE_CHANNEL_PORT = 5600
DEFAULT_MOONCAKE_BOOTSTRAP_PORT = 8998
# Object names must be DNS-1035 labels (Service names) with room for "-prefill" and the cell suffix.
MAX_NAME_LENGTH = 44
# Most replicas one pool may ask for (spec and autoscaling bounds): keeps StatefulSets, placement and drains bounded.
MAX_REPLICAS = 1000
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class SpecError(ValueError):
    """A PDDeployment spec that cannot be served; `.message` names the field path and the fix."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _quantity_text(value: Any) -> Any:
    """YAML writes `cpu: 8` as a number; Kubernetes quantities are strings."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


def _check_quantity(value: str) -> str:
    if not re.fullmatch(QUANTITY_PATTERN, value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 8, 500m, 64Gi)")
    return value


Quantity = Annotated[
    str,
    BeforeValidator(_quantity_text),
    AfterValidator(_check_quantity),
    WithJsonSchema({"x-kubernetes-int-or-string": True}),
]
FreeFormObject = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
LabelKey = Annotated[str, Field(pattern=LABEL_KEY_PATTERN, max_length=253)]
Port = Annotated[int, Field(ge=1, le=65535)]


class ApiModel(BaseModel):
    """Base of all spec models: camelCase on the wire, snake_case in Python, unknown fields are errors."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )


class ModelSpec(ApiModel):
    """The model the engines load and the name clients use for it."""

    name: str = Field(min_length=1, description="Model the engine loads (Hugging Face id or path).")
    served_model_name: str | None = Field(
        default=None,
        min_length=1,
        description="Model name clients send in requests; defaults to `name`.",
    )

    @property
    def served_name(self) -> str:
        """The name clients use: servedModelName, or the model name itself."""
        return self.served_model_name or self.name


class EnvVar(ApiModel):
    """An environment variable for the engine container (Kubernetes EnvVar shape)."""

    name: str = Field(pattern=ENV_NAME_PATTERN, description="Variable name.")
    value: str | None = Field(default=None, description="Literal value.")
    value_from: FreeFormObject | None = Field(
        default=None, description="Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, ...)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"env {self.name}: set either value or valueFrom, not both")
        return self


class EngineSpec(ApiModel):
    """Inference engine image and arguments shared by both pools."""

    kind: Literal["vllm", "sglang"] = Field(default="vllm", description="Engine implementation.")
    image: str = Field(default="vllm/vllm-openai:v0.32.0", min_length=1, description="Engine container image.")
    port: Port = Field(default=8000, description="HTTP port the engine serves the OpenAI API and /metrics on.")
    args: list[str] = Field(default_factory=list, description="Extra engine arguments, appended after pdfleet's.")
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment variables for the engine.")
    security_context: FreeFormObject | None = Field(
        default=None,
        description=(
            "Kubernetes SecurityContext of the engine container, merged key by key over pdfleet's (no privilege"
            " escalation, all capabilities dropped). vLLM's image runs as root; to run it non-root set runAsNonRoot"
            " with a runAsUser (and env HOME=/tmp so its caches are writable). See docs/security.md."
        ),
    )

    @model_validator(mode="after")
    def _unique_env(self) -> EngineSpec:
        names = [var.name for var in self.env]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"env names must be unique, repeated: {', '.join(duplicates)}")
        return self


UcxTransport = Annotated[str, Field(pattern=UCX_TRANSPORT_PATTERN, max_length=63)]
UcxDevice = Annotated[str, Field(pattern=UCX_DEVICE_PATTERN, max_length=63)]


class KVTransferSpec(ApiModel):
    """How decode instances pull the KV cache that prefill instances computed."""

    connector: Literal["nixl", "mooncake", "lmcache"] = Field(
        default="nixl", description="KV transfer connector (NIXL, Mooncake or LMCache)."
    )
    cache_dtype: Literal["auto", "fp8", "int8"] = Field(
        default="auto",
        description=(
            "KV cache data type; fp8/int8 quantize the cache (and the transfer). vLLM takes int8 as"
            " int8_per_token_head (its Triton attention backend); SGLang has no int8."
        ),
    )
    buffer_device: Literal["cuda", "cpu"] | None = Field(
        default=None,
        description=(
            "vLLM with nixl: where the KV is staged for transfer (kv_buffer_device). cuda: GPU memory (RDMA, NVLink);"
            " cpu: host memory, for transports that cannot register GPU memory (e.g. TCP). Unset: vLLM's default."
        ),
    )
    side_channel_port: Port | None = Field(
        default=None,
        description=(
            "vLLM with nixl: port of the NIXL handshake side channel (VLLM_NIXL_SIDE_CHANNEL_PORT), declared as"
            f" container port nixl-side. Unset: {DEFAULT_NIXL_SIDE_CHANNEL_PORT}."
        ),
    )
    bootstrap_port: Port | None = Field(
        default=None,
        description=(
            "vLLM with mooncake: port of the prefill's Mooncake bootstrap server (VLLM_MOONCAKE_BOOTSTRAP_PORT),"
            f" declared as container port mooncake-boot on prefill pods. Unset: {DEFAULT_MOONCAKE_BOOTSTRAP_PORT}."
        ),
    )
    mooncake_protocol: Literal["rdma", "tcp"] | None = Field(
        default=None,
        description=(
            "vLLM with mooncake: the Mooncake transfer engine's protocol (kv_connector_extra_config.mooncake_protocol);"
            " tcp for clusters without RDMA. Unset: vLLM's default (rdma)."
        ),
    )
    ucx_transports: list[UcxTransport] | None = Field(
        default=None,
        min_length=1,
        description=(
            "vLLM with nixl or lmcache: UCX transports NIXL may use (env UCX_TLS, joined with commas), e.g."
            " [rc, ud, sm, cuda_copy] with RDMA or [tcp, sm, self] without. Unset: UCX picks (all)."
        ),
    )
    ucx_net_devices: list[UcxDevice] | None = Field(
        default=None,
        min_length=1,
        description=(
            "vLLM with nixl or lmcache: network devices UCX may use (env UCX_NET_DEVICES, joined with commas), e.g."
            " [mlx5_0:1, mlx5_1:1] or [eth0]. Unset: UCX picks (all)."
        ),
    )

    @property
    def effective_side_channel_port(self) -> int:
        """The NIXL side-channel port vLLM listens on: sideChannelPort, else vLLM's default."""
        return self.side_channel_port or DEFAULT_NIXL_SIDE_CHANNEL_PORT

    @property
    def effective_bootstrap_port(self) -> int:
        """The Mooncake bootstrap port a vLLM prefill listens on: bootstrapPort, else vLLM's default."""
        return self.bootstrap_port or DEFAULT_MOONCAKE_BOOTSTRAP_PORT


# Which kvTransfer fields apply to which vLLM connectors (none applies to SGLang), and the env var each one renders.
VLLM_ONLY_KV_FIELDS: dict[str, tuple[str, ...]] = {
    "buffer_device": ("nixl",),
    "side_channel_port": ("nixl",),
    "bootstrap_port": ("mooncake",),
    "mooncake_protocol": ("mooncake",),
    # LMCache's disaggregated prefill moves the KV through NIXL too, so UCX's settings reach it.
    "ucx_transports": ("nixl", "lmcache"),
    "ucx_net_devices": ("nixl", "lmcache"),
}
KV_FIELD_ENV = {
    "side_channel_port": "VLLM_NIXL_SIDE_CHANNEL_PORT",
    "bootstrap_port": "VLLM_MOONCAKE_BOOTSTRAP_PORT",
    "ucx_transports": "UCX_TLS",
    "ucx_net_devices": "UCX_NET_DEVICES",
}


class Toleration(ApiModel):
    """A Kubernetes toleration."""

    key: str | None = Field(default=None, description="Taint key; empty with operator Exists matches every taint.")
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="Exists or Equal.")
    value: str | None = Field(default=None, description="Taint value for operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate; empty tolerates all effects."
    )
    toleration_seconds: int | None = Field(default=None, ge=0, description="How long a NoExecute taint is tolerated.")


class AutoscalingSpec(ApiModel):
    """SLA-driven autoscaling of one pool (TTFT for prefill, TPOT for decode)."""

    enabled: bool = Field(default=False, description="Let the autoscaler own this pool's replica count.")
    min_replicas: int = Field(default=1, ge=0, le=MAX_REPLICAS, description="Lower bound of the replica count.")
    max_replicas: int = Field(
        default=8, ge=1, le=MAX_REPLICAS, description=f"Upper bound of the replica count (at most {MAX_REPLICAS})."
    )
    target_latency_ms: float | None = Field(
        default=None,
        gt=0,
        description="Latency target in ms; default sla.ttftMs for prefill, sla.tpotMs for decode.",
    )
    target_queue_depth_per_replica: float = Field(
        default=4, gt=0, description="Waiting requests per replica the pool may carry before scaling up."
    )
    tolerance: float = Field(
        default=0.1, ge=0, lt=1, description="Relative deviation from target ignored by the autoscaler."
    )
    scale_up_stabilization_seconds: int = Field(
        default=0, ge=0, description="Scale up to the lowest recommendation of this trailing window."
    )
    scale_down_stabilization_seconds: int = Field(
        default=300, ge=0, description="Scale down to the highest recommendation of this trailing window."
    )
    max_scale_up_step: int = Field(
        default=4, ge=0, description="Most replicas added per decision; 0 = unlimited (jump to the estimate)."
    )
    max_scale_down_step: int = Field(default=1, ge=0, description="Most replicas removed per decision; 0 = unlimited.")
    capacity_tokens_per_second: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Tokens/s one replica sustains within its SLA (prompt tokens/s for prefill, generated tokens/s for decode),"
            " e.g. from a profiling run; sizes the pool from its token demand. Unset: learned while the pool is"
            " saturated."
        ),
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"minReplicas ({self.min_replicas}) must be <= maxReplicas ({self.max_replicas})")
        return self


class PoolSpec(ApiModel):
    """One engine pool (prefill or decode): size, GPUs, scheduling and autoscaling."""

    replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_REPLICAS,
        description=(
            f"Replica count (at most {MAX_REPLICAS}); the autoscaler's decision replaces it when autoscaling is on."
        ),
    )
    gpus_per_replica: int = Field(default=1, ge=0, description="nvidia.com/gpu limit per pod (tensor parallel size).")
    gpu_product: str | None = Field(
        default=None,
        pattern=LABEL_VALUE_PATTERN,
        max_length=63,
        description="Required value of the node's topology.gpuProductLabel (e.g. NVIDIA-H100-80GB-HBM3).",
    )
    resources: dict[str, Quantity] = Field(
        default_factory=dict,
        description="CPU/memory (and other non-GPU) resources per pod, used as both requests and limits.",
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels the pods require.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Tolerations for the pods.")
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec, description="Autoscaling of this pool.")

    @model_validator(mode="after")
    def _gpus(self) -> PoolSpec:
        if self.gpu_product is not None and self.gpus_per_replica < 1:
            raise ValueError(f"gpusPerReplica must be >= 1 when gpuProduct is set (got {self.gpus_per_replica})")
        if GPU_RESOURCE in self.resources:
            raise ValueError(f"resources must not set {GPU_RESOURCE}; use gpusPerReplica")
        return self


class PrefillAutoscalingSpec(AutoscalingSpec):
    """Autoscaling of the prefill pool, which may reach zero replicas."""

    min_replicas: int = Field(
        default=0,
        ge=0,
        le=MAX_REPLICAS,
        description=(
            "Lower bound of the replica count. At 0 the pool goes to zero while the decode replicas can compute the"
            " prompts within the SLA; the router then serves every request whole on a decode, and prefill replicas"
            " come back when the prompts need them. Set 1 to always keep one."
        ),
    )


class PrefillPoolSpec(PoolSpec):
    """The prefill pool: a PoolSpec whose autoscaling may take it to zero replicas."""

    autoscaling: PrefillAutoscalingSpec = Field(
        default_factory=PrefillAutoscalingSpec, description="Autoscaling of this pool."
    )


class TopologySpec(ApiModel):
    """Which node labels describe racks, zones and GPU products, and how cells are placed."""

    rack_label: LabelKey = Field(default="topology.pdfleet.dev/rack", description="Node label naming the rack.")
    zone_label: LabelKey = Field(default="topology.kubernetes.io/zone", description="Node label naming the zone.")
    gpu_product_label: LabelKey = Field(
        default="nvidia.com/gpu.product", description="Node label naming the GPU product."
    )
    placement: Literal["RackPaired", "Spread", "Unconstrained"] = Field(
        default="RackPaired",
        description="RackPaired: every rack with prefill has decode; Spread: pools spread independently; "
        "Unconstrained: no rack affinity.",
    )


class RouterPolicy(ApiModel):
    """Routing policy of the PD router (copied into the fleet view)."""

    locality: Literal["required", "preferred", "any"] = Field(
        default="preferred", description="Whether the decode instance must/should share the prefill's rack."
    )
    disaggregate_min_prompt_tokens: int = Field(
        default=256, ge=0, description="Prompts shorter than this go straight to a decode instance."
    )
    prefix_affinity: bool = Field(default=True, description="Route equal prompt prefixes to the same prefill.")
    prefix_block_tokens: int = Field(default=64, ge=1, description="Prefix hashing block size in tokens.")
    max_prefill_retries: int = Field(default=2, ge=0, description="Retries on another prefill instance.")
    max_decode_retries: int = Field(default=2, ge=0, description="Retries on another decode instance.")
    prefill_timeout_seconds: int = Field(default=60, ge=1, description="Timeout of the prefill stage.")
    decode_timeout_seconds: int = Field(default=600, ge=1, description="Timeout of the decode stage.")
    first_byte_timeout_seconds: float | None = Field(
        default=None,
        gt=0,
        description="Longest wait for the first body byte of a prefill, decode or direct reply (a non-streamed reply "
        "also gets interChunkTimeoutSeconds/20 per requested token); the endpoint counts as failing. "
        "Default: 4 x sla.ttftMs + 10 s.",
    )
    inter_chunk_timeout_seconds: float | None = Field(
        default=None,
        gt=0,
        description="Longest silence of a decode or direct reply once it started; the endpoint counts as failing. "
        "Default: 20 x sla.tpotMs, at least 5 s.",
    )


class RouterSpec(ApiModel):
    """The rack-aware PD router Deployment."""

    replicas: int = Field(default=1, ge=1, description="Router replicas.")
    image: str | None = Field(default=None, min_length=1, description="Router image; default: the operator's image.")
    port: Port = Field(default=8080, description="Data port (OpenAI API).")
    admin_port: Port = Field(default=8081, description="Admin port (/metrics, /admin/*, /ready).")
    policy: RouterPolicy = Field(default_factory=RouterPolicy, description="Routing policy.")

    @model_validator(mode="after")
    def _distinct_ports(self) -> RouterSpec:
        if self.port == self.admin_port:
            raise ValueError(f"port and adminPort must differ (both {self.port})")
        return self


class SLASpec(ApiModel):
    """Latency objectives the autoscaler holds each pool to."""

    ttft_ms: float = Field(default=500, gt=0, description="Time-to-first-token target in ms (prefill pool).")
    tpot_ms: float = Field(default=50, gt=0, description="Time-per-output-token target in ms (decode pool).")
    percentile: float = Field(default=90, gt=0, lt=100, description="Latency percentile the targets apply to.")


class RatioBand(ApiModel):
    """Allowed band of the prefill:decode replica ratio."""

    min: float = Field(gt=0, description="Lowest prefill/decode replica ratio.")
    max: float = Field(gt=0, description="Highest prefill/decode replica ratio.")

    @model_validator(mode="after")
    def _ordered(self) -> RatioBand:
        if self.min > self.max:
            raise ValueError(f"min ({self.min:g}) must be <= max ({self.max:g})")
        return self


class AutoscalerSpec(ApiModel):
    """Fleet-wide autoscaler settings."""

    interval_seconds: int = Field(default=15, ge=1, description="Seconds between scaling decisions.")
    window_seconds: int = Field(default=60, ge=1, description="PromQL rate/quantile window in seconds.")
    drain_timeout_seconds: int = Field(
        default=120, ge=0, description="Longest wait for in-flight requests before a replica is removed."
    )
    gpu_budget: int | None = Field(default=None, ge=1, description="Most GPUs both pools may use together.")
    pd_ratio: RatioBand | None = Field(default=None, description="Allowed prefill:decode replica ratio band.")


class PrometheusSpec(ApiModel):
    """Where the autoscaler queries metrics."""

    url: str = Field(
        default="http://prometheus-operated.monitoring.svc:9090",
        pattern=r"^https?://[^\s]+$",
        description="Prometheus base URL.",
    )


class PDDeploymentSpec(ApiModel):
    """Desired state of a prefill/decode-disaggregated inference fleet."""

    model: ModelSpec = Field(description="The model to serve.")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="Inference engine.")
    kv_transfer: KVTransferSpec = Field(default_factory=KVTransferSpec, description="KV cache transfer.")
    prefill: PrefillPoolSpec = Field(default_factory=PrefillPoolSpec, description="Prefill pool.")
    decode: PoolSpec = Field(default_factory=PoolSpec, description="Decode pool.")
    topology: TopologySpec = Field(default_factory=TopologySpec, description="Racks, zones, GPU labels, placement.")
    router: RouterSpec = Field(default_factory=RouterSpec, description="PD router.")
    sla: SLASpec = Field(default_factory=SLASpec, description="Latency objectives.")
    autoscaler: AutoscalerSpec = Field(default_factory=AutoscalerSpec, description="Autoscaler settings.")
    prometheus: PrometheusSpec = Field(default_factory=PrometheusSpec, description="Metrics source.")

    def pool(self, name: str) -> PoolSpec:
        """The PoolSpec of `name` ("prefill" or "decode")."""
        if name not in POOLS:
            raise KeyError(f"unknown pool {name!r}")
        return self.prefill if name == "prefill" else self.decode

    def target_latency_ms(self, pool: str) -> float:
        """The pool's latency target: its autoscaling.targetLatencyMs, else TTFT (prefill) / TPOT (decode) SLA."""
        explicit = self.pool(pool).autoscaling.target_latency_ms
        if explicit is not None:
            return explicit
        return self.sla.ttft_ms if pool == "prefill" else self.sla.tpot_ms

    @model_validator(mode="after")
    def _engine_supports_kv_transfer(self) -> PDDeploymentSpec:
        if self.engine.kind == "sglang" and self.kv_transfer.connector == "lmcache":
            raise ValueError("kvTransfer.connector: sglang supports nixl or mooncake, not lmcache")
        if self.engine.kind == "sglang" and self.kv_transfer.cache_dtype == "int8":
            raise ValueError("kvTransfer.cacheDtype: sglang supports auto or fp8, not int8")
        return self

    @model_validator(mode="after")
    def _kv_transport_settings_fit(self) -> PDDeploymentSpec:
        kv = self.kv_transfer
        user_env = {var.name for var in self.engine.env}
        for name, connectors in VLLM_ONLY_KV_FIELDS.items():
            if getattr(kv, name) is None:
                continue
            field = f"kvTransfer.{to_camel(name)}"
            if self.engine.kind != "vllm":
                raise ValueError(f"{field}: applies to vLLM's KV connectors, not engine.kind {self.engine.kind}")
            if kv.connector not in connectors:
                raise ValueError(f"{field}: applies to connector {' or '.join(connectors)}, not {kv.connector}")
            if KV_FIELD_ENV.get(name) in user_env:
                raise ValueError(f"{field}: engine.env also sets {KV_FIELD_ENV[name]}; set only one of them")
        return self

    @model_validator(mode="after")
    def _engine_ports_distinct(self) -> PDDeploymentSpec:
        if self.engine.kind != "vllm":
            return self
        kv = self.kv_transfer
        if kv.connector == "nixl":
            field, what, port = "sideChannelPort", "NIXL side channel", kv.effective_side_channel_port
            default = DEFAULT_NIXL_SIDE_CHANNEL_PORT
        elif kv.connector == "mooncake":
            field, what, port = "bootstrapPort", "Mooncake bootstrap server", kv.effective_bootstrap_port
            default = DEFAULT_MOONCAKE_BOOTSTRAP_PORT
        else:
            return self
        if port == self.engine.port:
            raise ValueError(
                f"engine.port: {port} is also the {what} port (kvTransfer.{field}, default {default});"
                " give one of them another port"
            )
        return self

    @model_validator(mode="after")
    def _budget_covers_minimums(self) -> PDDeploymentSpec:
        budget = self.autoscaler.gpu_budget
        if budget is None:
            return self
        floors = {name: self._replica_floor(name) for name in POOLS}
        needed = sum(floors[name] * self.pool(name).gpus_per_replica for name in POOLS)
        if needed > budget:
            detail = " + ".join(f"{name} {floors[name]} x {self.pool(name).gpus_per_replica}" for name in POOLS)
            raise ValueError(
                f"autoscaler.gpuBudget: {budget} GPUs is less than the pools need at least ({detail} = {needed})"
            )
        return self

    def _replica_floor(self, pool: str) -> int:
        spec = self.pool(pool)
        return spec.autoscaling.min_replicas if spec.autoscaling.enabled else spec.replicas


# --- status ------------------------------------------------------------------------------------------------------


class StatusModel(BaseModel):
    """Base of status models: written by the operator, so unknown fields from other versions are ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class PoolStatus(StatusModel):
    """Replica counts of one pool, summed over its cells."""

    desired_replicas: int = Field(default=0, description="Replicas the spec asks for.")
    current_replicas: int = Field(default=0, description="Pods that exist.")
    ready_replicas: int = Field(default=0, description="Pods that are Ready.")
    summary: str = Field(default="0/0", description="ready/desired, for kubectl get.")
    selector: str = Field(
        default="", description="Label selector of the pool's pods (the scale subresource's, for an HPA)."
    )

    @classmethod
    def of(cls, desired: int, current: int, ready: int, selector: str = "") -> PoolStatus:
        """A PoolStatus with its summary filled in."""
        summary = f"{ready}/{desired}"
        return cls(
            desired_replicas=desired, current_replicas=current, ready_replicas=ready, summary=summary, selector=selector
        )


class CellStatus(StatusModel):
    """One (pool, rack) StatefulSet."""

    name: str = Field(description="StatefulSet name.")
    pool: PoolName = Field(description="prefill or decode.")
    rack: str = Field(description="Rack the cell is pinned to; empty when unconstrained.")
    zone: str = Field(default="", description="Zone of the rack.")
    desired: int = Field(default=0, description="Desired replicas.")
    ready: int = Field(default=0, description="Ready replicas.")


class Condition(StatusModel):
    """A Kubernetes-style status condition."""

    type: str = Field(description="Condition type (Ready, Degraded, Progressing, ...).")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="CamelCase machine reason.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: str | None = Field(default=None, description="RFC 3339 time of the last status change.")


class PoolAutoscalerStatus(StatusModel):
    """The autoscaler's last decision for one pool."""

    desired_replicas: int | None = Field(default=None, description="Replicas the autoscaler wants.")
    driving_signal: str | None = Field(default=None, description="Signal that determined the decision.")
    signals: dict[str, float] = Field(default_factory=dict, description="Signal name -> observed value.")
    last_scale_time: str | None = Field(default=None, description="RFC 3339 time of the last scale change.")


class MetricsStatus(StatusModel):
    """Whether the autoscaler could read its signals from Prometheus."""

    available: bool = Field(default=False, description="Signals were read on the last evaluation.")
    reason: str = Field(default="", description="CamelCase machine reason.")
    message: str = Field(default="", description="Human-readable detail.")
    missing: dict[str, list[str]] | None = Field(
        default=None,
        description="Per autoscaled pool, the signals whose query returned nothing for it (the autoscaler holds).",
    )


class AutoscalerStatus(StatusModel):
    """The autoscaler's decisions per pool."""

    metrics: MetricsStatus | None = Field(default=None, description="Availability of the autoscaler's signals.")
    prefill: PoolAutoscalerStatus | None = Field(default=None, description="Prefill pool decision.")
    decode: PoolAutoscalerStatus | None = Field(default=None, description="Decode pool decision.")


class DrainStatus(StatusModel):
    """A scale-down in progress: endpoints marked draining until their in-flight work is done."""

    pool: PoolName = Field(description="Pool being shrunk.")
    target_replicas: int = Field(description="Replica count after the drain.")
    endpoints: list[str] = Field(default_factory=list, description="Pod names being drained.")
    started_at: str = Field(description="RFC 3339 time the drain started.")
    cause: str = Field(default="", description="Why the pool shrinks (the autoscaler's decision).")


class FleetViewStatus(StatusModel):
    """The router fleet view last rendered: routers take views by revision, file or push alike."""

    revision: int = Field(description="Raised by one each time the view's content changes.")
    hash: str = Field(description="Content hash of the view at this revision.")


class PDDeploymentStatus(StatusModel):
    """Observed state of a PDDeployment."""

    observed_generation: int | None = Field(default=None, description="metadata.generation last reconciled.")
    prefill: PoolStatus = Field(default_factory=PoolStatus, description="Prefill pool replicas.")
    decode: PoolStatus = Field(default_factory=PoolStatus, description="Decode pool replicas.")
    cells: list[CellStatus] = Field(default_factory=list, description="Per-cell breakdown.")
    conditions: list[Condition] = Field(default_factory=list, description="Ready, Degraded, Progressing, ...")
    autoscaler: AutoscalerStatus | None = Field(default=None, description="Autoscaler decisions.")
    drain: DrainStatus | None = Field(default=None, description="Scale-down drain in progress.")
    fleet_view: FleetViewStatus | None = Field(default=None, description="Router fleet view revision.")
    model: str | None = Field(default=None, description="Model name clients send (spec.model.servedModelName).")
    router_url: str | None = Field(default=None, description="In-cluster URL of the router's OpenAI API.")


# --- parsing -----------------------------------------------------------------------------------------------------


def _wire_path(loc: tuple[int | str, ...]) -> str:
    """`spec.a.b[0].c` from a pydantic error location (locations carry the wire aliases, as the input used them)."""
    path = "spec"
    for item in loc:
        path += f"[{item}]" if isinstance(item, int) else f".{item}"
    return path


def _describe(error: dict[str, Any]) -> str:
    """One line for one pydantic error: `spec.path: what is wrong`."""
    path = _wire_path(tuple(error["loc"]))
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"{path}: unknown field (check its spelling; fields are camelCase)"
    if kind == "missing":
        return f"{path}: required field is missing"
    if kind == "string_pattern_mismatch":
        return f"{path}: {error['input']!r} must match the pattern {error['ctx']['pattern']}"
    message = str(error["msg"]).removeprefix("Value error, ")
    if kind == "literal_error":
        message = f"{message}, got {error['input']!r}"
    if path == "spec" and ": " in message:
        # Cross-section checks on the whole spec name their own field path.
        return f"spec.{message}"
    return f"{path}: {message}"


def parse_spec(spec: dict[str, Any]) -> PDDeploymentSpec:
    """Validate a PDDeployment `spec` (wire form, camelCase) into a PDDeploymentSpec.

    Raises SpecError whose message names each offending field path, e.g.
    "spec.prefill.autoscaling: minReplicas (5) must be <= maxReplicas (2)".
    """
    if not isinstance(spec, dict):
        raise SpecError(f"spec: must be an object, got {type(spec).__name__}")
    try:
        return PDDeploymentSpec.model_validate(spec)
    except ValidationError as exc:
        lines = [_describe(error) for error in exc.errors(include_url=False)]
        raise SpecError("; ".join(lines)) from None


def validate_name(name: str) -> None:
    """Check that a PDDeployment's metadata.name can name all its children (Services need DNS-1035 labels).

    Raises SpecError otherwise.
    """
    if len(name) > MAX_NAME_LENGTH or not re.fullmatch(NAME_PATTERN, name):
        raise SpecError(
            f"metadata.name: {name!r} must be at most {MAX_NAME_LENGTH} characters of lowercase letters, digits and "
            "'-', start with a letter and end with a letter or digit (it prefixes Service and StatefulSet names)"
        )


# --- unknown fields ----------------------------------------------------------------------------------------------

LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"


@functools.cache
def _spec_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """The spec's JSON schema (what the CRD is generated from) and its definitions; read-only."""
    schema = PDDeploymentSpec.model_json_schema(by_alias=True)
    return schema, schema.get("$defs", {})


def _object_schema(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """The schema node itself with `$ref` / single `allOf` inlined and an optional (`anyOf [X, null]`) unwrapped."""
    while True:
        if "$ref" in node:
            node = {**defs[node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
        elif len(node.get("allOf", ())) == 1:
            node = {**node["allOf"][0], **{k: v for k, v in node.items() if k != "allOf"}}
        elif "anyOf" in node:
            members = [m for m in node["anyOf"] if m != {"type": "null"}]
            node = {**(members[0] if len(members) == 1 else {}), **{k: v for k, v in node.items() if k != "anyOf"}}
        else:
            return node


def _unknown(value: Any, node: dict[str, Any], defs: dict[str, Any], path: str, found: list[str]) -> None:
    node = _object_schema(node, defs)
    if isinstance(value, dict):
        properties = node.get("properties")
        if properties is not None:
            for key, child in value.items():
                if key in properties:
                    _unknown(child, properties[key], defs, f"{path}.{key}", found)
                else:
                    found.append(f"{path}.{key}")
        elif isinstance(node.get("additionalProperties"), dict):
            for key, child in value.items():
                _unknown(child, node["additionalProperties"], defs, f"{path}.{key}", found)
        # else a free-form object (x-kubernetes-preserve-unknown-fields): every key is the user's
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for index, item in enumerate(value):
            _unknown(item, node["items"], defs, f"{path}[{index}]", found)


def unknown_fields(spec: Any) -> list[str]:
    """Wire paths (`spec.prefill.replica`) of the fields in a PDDeployment spec (wire form) the API does not define:
    what the API server prunes from a stored object. Only the names are checked (the wire, camelCase ones; a wrong
    type is the schema's to report); map and free-form values (resources, nodeSelector, env valueFrom) take any key.
    """
    schema, defs = _spec_schema()
    found: list[str] = []
    if isinstance(spec, dict):
        _unknown(spec, schema, defs, "spec", found)
    return sorted(found)


def _managed_spec(fields: Any) -> dict[str, Any]:
    """The `f:spec` part of a managedFields FieldsV1 set as a nested dict of field names (list items are left out:
    the CRD's lists are atomic, so their items are not listed)."""
    out: dict[str, Any] = {}
    if isinstance(fields, dict):
        for key, child in fields.items():
            if isinstance(key, str) and key.startswith("f:"):
                out[key[2:]] = _managed_spec(child)
    return out


def applied_specs(metadata: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The specs as users wrote them, before the API server pruned unknown fields: kubectl's last-applied
    configuration (client-side apply) and each server-side apply's managed field set (managedFields, operation
    Apply). Neither is pruned, on any API server version; `kubectl create`/`replace`/`edit` leave no such trace."""
    specs: list[dict[str, Any]] = []
    last_applied = (metadata.get("annotations") or {}).get(LAST_APPLIED_ANNOTATION)
    if last_applied:
        try:
            manifest = json.loads(last_applied)
        except ValueError:
            manifest = None
        if isinstance(manifest, dict) and isinstance(manifest.get("spec"), dict):
            specs.append(manifest["spec"])
    for entry in metadata.get("managedFields") or []:
        if isinstance(entry, Mapping) and entry.get("operation") == "Apply":
            managed = _managed_spec((entry.get("fieldsV1") or {}).get("f:spec"))
            if managed:
                specs.append(managed)
    return specs


def applied_unknown_fields(metadata: Mapping[str, Any], spec: Any = None) -> list[str]:
    """Unknown field paths in the stored `spec` and in every spec users applied (see `applied_specs`), sorted."""
    found = set(unknown_fields(spec))
    for applied in applied_specs(metadata):
        found.update(unknown_fields(applied))
    return sorted(found)
