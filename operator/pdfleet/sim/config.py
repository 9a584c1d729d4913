"""The simulated fleet: hardware and model presets, racks, engine limits, router policy, SLA and prices."""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

from pdfleet.perfmodel.presets import (
    DEFAULT_CROSS_RACK,
    DEFAULT_INTRA_RACK,
    InterconnectPreset,
    gpu_preset,
    interconnect_preset,
    model_preset,
)
from pdfleet.perfmodel.timing import Hardware, effective_max_model_len, kv_bytes_per_token, kv_capacity_tokens


@dataclass(frozen=True)
class FleetConfig:
    """Everything fixed about a simulated fleet; the scaling policy only moves replica counts.

    Field names follow the PDDeployment API (router policy, SLA) and vLLM engine args where they exist.
    """

    model: str = "llama-3.1-70b"
    gpu: str = "H100-SXM"
    gpus_per_replica: int = 4  # tensor-parallel size of one engine instance
    kv_cache_dtype: str = "auto"
    racks: int = 4
    gpus_per_rack: int = 64
    zones: int = 2  # rack i sits in zone i % zones
    disaggregated: bool = True  # False: every instance runs both phases (chunked prefill), no KV transfer
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9
    intra_rack_link: str = DEFAULT_INTRA_RACK
    cross_rack_link: str = DEFAULT_CROSS_RACK
    locality: str = "preferred"  # required | preferred | any
    disaggregate_min_prompt_tokens: int = 256
    prefix_affinity: bool = True
    prefix_block_tokens: int = 64
    prefix_caching: bool = True  # vLLM's automatic prefix caching: free KV blocks keep their prefixes, LRU-evicted
    max_model_len: int = 0  # vLLM --max-model-len; 0 = the model's context (capped by the KV cache, as vLLM does)
    startup_s: float = 120.0  # pod start + model load before a new replica is Ready
    # where the scaling policies start: "mean" (static-mean's size) or "first" (sized for the trace's first minute, a
    # cold start when the load then ramps)
    scaler_start: str = "mean"
    ttft_ms: float = 500.0
    tpot_ms: float = 50.0
    percentile: float = 90.0
    gpu_hour_usd: float = 2.5

    @cached_property
    def hardware(self) -> Hardware:
        """The timing model's view of one instance."""
        return Hardware(model_preset(self.model), gpu_preset(self.gpu), self.gpus_per_replica, self.kv_cache_dtype)

    @cached_property
    def kv_capacity_tokens(self) -> int:
        """KV tokens one instance holds (0 means the model does not fit)."""
        return kv_capacity_tokens(self.hardware, self.gpu_memory_utilization)

    @cached_property
    def context_limit(self) -> int:
        """Longest prompt + output an instance accepts; a longer request is rejected, as vLLM rejects it."""
        return effective_max_model_len(self.hardware.model, self.kv_capacity_tokens, self.max_model_len)

    @cached_property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV one prompt token moves from prefill to decode."""
        return kv_bytes_per_token(self.hardware.model, self.kv_cache_dtype)

    @cached_property
    def links(self) -> tuple[InterconnectPreset, InterconnectPreset]:
        """(intra-rack, cross-rack) links for KV transfers."""
        return interconnect_preset(self.intra_rack_link), interconnect_preset(self.cross_rack_link)

    @property
    def total_gpus(self) -> int:
        """GPUs in all racks: the ceiling of every policy."""
        return self.racks * self.gpus_per_rack

    @property
    def max_replicas(self) -> int:
        """Most instances the racks hold."""
        return self.racks * (self.gpus_per_rack // self.gpus_per_replica)

    def rack_names(self) -> list[tuple[str, str]]:
        """(rack, zone) of every rack."""
        return [(f"rack-{i}", f"zone-{i % max(1, self.zones)}") for i in range(self.racks)]

    def validate(self) -> None:
        """Raise ValueError for a fleet the timing model cannot run."""
        if self.kv_capacity_tokens <= 0:
            raise ValueError(f"{self.model} does not fit on {self.gpus_per_replica} x {self.gpu}")
        if self.gpus_per_rack < self.gpus_per_replica:
            raise ValueError("a rack must hold at least one replica")
        if self.locality not in ("required", "preferred", "any"):
            raise ValueError(f"unknown locality {self.locality!r}")
        if self.scaler_start not in ("mean", "first"):
            raise ValueError(f"scaler_start must be mean or first, not {self.scaler_start!r}")


def fleet_from_options(options: dict[str, Any]) -> FleetConfig:
    """A FleetConfig from a {field: value} mapping (e.g. parsed CLI key=value pairs), values cast to field types."""
    kinds = {f.name: f.type for f in fields(FleetConfig)}
    values: dict[str, Any] = {}
    for key, value in options.items():
        if key not in kinds:
            raise ValueError(f"unknown fleet option {key!r}; known: {', '.join(kinds)}")
        kind = kinds[key]
        if kind == "bool" and isinstance(value, str):
            values[key] = value.lower() in ("1", "true", "yes", "on")
        else:
            values[key] = {"int": int, "float": float, "str": str, "bool": bool}[kind](value)
    fleet = FleetConfig(**values)
    fleet.validate()
    return fleet
