"""One engine replica in the timing model, and its capacity at the SLA: the autoscaler's prior and the simulator's
profile.

What an offline profiling sweep of one instance would measure: prompt tokens/s prefilling back to back and generated
tokens/s at the largest decode batch within the TPOT target, each derated to the share that still meets the SLA under
bursty arrivals. Pure functions; results are cached per (replica model, rounded input).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

from pdfleet.perfmodel.presets import gpu_preset, model_preset
from pdfleet.perfmodel.timing import Hardware, decode_step_time, kv_capacity_tokens, prefill_time
from pdfleet.perfmodel.vllm_args import vllm_batch_limits

# Share of a replica's profiled capacity that still meets the SLA under bursty arrivals: prefill queues (TTFT tails
# grow fast past ~0.55 on the Azure conv trace), decode only loses batch slots (ITL stays within target).
PREFILL_UTILIZATION = 0.5
DECODE_UTILIZATION = 0.8


@dataclass(frozen=True)
class ReplicaModel:
    """One engine replica as the timing model sees it: hardware plus the vLLM limits that bound its batches."""

    hardware: Hardware
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9

    @cached_property
    def kv_capacity_tokens(self) -> int:
        """KV tokens one replica holds (0 means the model does not fit)."""
        return kv_capacity_tokens(self.hardware, self.gpu_memory_utilization)


def replica_model(
    model_name: str,
    gpu_product: str | None,
    tp: int,
    kv_cache_dtype: str = "auto",
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
    gpu_memory_utilization: float = 0.9,
) -> ReplicaModel | None:
    """The ReplicaModel of a model id (HF id or preset) on `tp` GPUs of a product label; None when the model or GPU
    matches no preset, or the model does not fit (a guessed prior would be worse than learning)."""
    if not gpu_product or tp < 1:
        return None
    try:
        hardware = Hardware(model_preset(model_name), gpu_preset(gpu_product), tp, kv_cache_dtype)
    except (KeyError, ValueError):
        return None
    replica = ReplicaModel(hardware, max_num_seqs, max_num_batched_tokens, gpu_memory_utilization)
    return replica if replica.kv_capacity_tokens > 0 else None


@lru_cache(maxsize=256)
def _engine_replica_model(
    engine_kind: str,
    engine_args: tuple[str, ...],
    model_name: str,
    gpu_product: str | None,
    tp: int,
    kv_cache_dtype: str,
) -> ReplicaModel | None:
    limits = vllm_batch_limits(list(engine_args)) if engine_kind == "vllm" else {}
    return replica_model(model_name, gpu_product, tp, kv_cache_dtype, **limits)


def pool_replica_model(spec: Any, pool: str) -> ReplicaModel | None:
    """The ReplicaModel of one pool of a PDDeploymentSpec (model, the pool's GPUs, KV dtype, vLLM batch args), or None
    when its gpuProduct or the model matches no preset. Built once per distinct input: the autoscaler asks every
    interval, and the engine args are parsed only when the spec changes."""
    pool_spec = spec.pool(pool)
    return _engine_replica_model(
        spec.engine.kind,
        tuple(spec.engine.args),
        spec.model.name,
        pool_spec.gpu_product,
        pool_spec.gpus_per_replica,
        spec.kv_transfer.cache_dtype,
    )


def _bucket(tokens: float) -> int:
    """Round token counts to 64 so the caches stay small."""
    return max(64, int(round(tokens / 64.0)) * 64)


@lru_cache(maxsize=4096)
def _prefill_ttft(replica: ReplicaModel, isl: int) -> float:
    return prefill_time(replica.hardware, isl, replica.max_num_batched_tokens)


def prefill_ttft(replica: ReplicaModel, isl: float) -> float:
    """Seconds to prefill one prompt of `isl` tokens on an idle replica (the profiled TTFT)."""
    return _prefill_ttft(replica, _bucket(isl))


@lru_cache(maxsize=1024)
def _longest_prefill_within(replica: ReplicaModel, budget_us: int) -> int:
    budget_s = budget_us / 1e6
    if _prefill_ttft(replica, 64) > budget_s:
        return 0
    lo, hi = 1, 2  # in 64-token units: the largest n with prefill(64 n) within the budget lies in [lo, hi)
    while _prefill_ttft(replica, 64 * hi) <= budget_s and hi < 1 << 16:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # prefill time grows with the prompt
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _prefill_ttft(replica, 64 * mid) <= budget_s else (lo, mid)
    return 64 * lo


def longest_prefill_within(replica: ReplicaModel, seconds: float) -> int:
    """The longest prompt (uncached tokens, in steps of 64) an idle replica prefills within `seconds`; 0 when even
    the shortest does not fit."""
    return _longest_prefill_within(replica, max(0, int(seconds * 1e6)))


def prefill_throughput(replica: ReplicaModel, isl: float) -> float:
    """Prompt tokens/s one replica sustains prefilling `isl`-token prompts back to back."""
    bucket = _bucket(isl)
    return bucket / _prefill_ttft(replica, bucket)


def decode_itl(replica: ReplicaModel, batch: float, context: float) -> float:
    """Profiled inter-token latency at `batch` running sequences of `context` KV tokens each."""
    b = max(1, int(round(batch)))
    return decode_step_time(replica.hardware, b, int(b * context))


@lru_cache(maxsize=4096)
def _best_decode(replica: ReplicaModel, itl_target_us: int, context: int) -> float:
    itl_target = itl_target_us / 1e6
    if decode_itl(replica, 1, context) > itl_target:
        return 1.0 / decode_itl(replica, 1, context)  # even batch 1 misses: the best it can do
    lo, hi = 1, min(replica.max_num_seqs, max(1, replica.kv_capacity_tokens // max(1, context)))
    while lo < hi:  # step time grows with batch: largest batch within the target
        mid = (lo + hi + 1) // 2
        if decode_itl(replica, mid, context) <= itl_target:
            lo = mid
        else:
            hi = mid - 1
    return lo / decode_itl(replica, lo, context)


def decode_capacity(replica: ReplicaModel, itl_target_s: float, context: float) -> float:
    """Most generated tokens/s one replica sustains with ITL <= target at `context` tokens per sequence."""
    return _best_decode(replica, max(1, int(itl_target_s * 1e6)), _bucket(context))


def prefill_sla_capacity(replica: ReplicaModel, isl: float) -> float:
    """Prompt tokens/s per prefill replica at the SLA: back-to-back throughput at PREFILL_UTILIZATION."""
    return prefill_throughput(replica, isl) * PREFILL_UTILIZATION


def decode_sla_capacity(replica: ReplicaModel, tpot_ms: float, isl: float, osl: float) -> float:
    """Generated tokens/s per decode replica at the SLA: throughput within the TPOT target at the mean context
    (prompt plus half the output), at DECODE_UTILIZATION."""
    return decode_capacity(replica, tpot_ms / 1000.0, isl + osl / 2) * DECODE_UTILIZATION


def sla_capacity(replica: ReplicaModel, tpot_ms: float, isl: float, osl: float) -> dict[str, float]:
    """{"prefill": prompt tok/s, "decode": generated tok/s} per replica at the SLA for mean lengths isl/osl."""
    return {"prefill": prefill_sla_capacity(replica, isl), "decode": decode_sla_capacity(replica, tpot_ms, isl, osl)}
