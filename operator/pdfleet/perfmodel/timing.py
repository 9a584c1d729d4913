"""Pure timing model of one vLLM-style engine: step times, KV sizes, KV capacity and KV transfer times.

No asyncio, no clocks: the emulator's scheduler and the fleet simulator (`pdfleet.sim`) call the same functions.
An engine step runs a batch of prefill chunk tokens and decode tokens; its time is the larger of the compute time
(linear layers ~2 x params FLOPs per token, plus attention over the context) and the memory time (weights plus the KV
read by decode), plus a fixed per-step and a small per-sequence overhead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdfleet.perfmodel.presets import GpuPreset, InterconnectPreset, ModelPreset

KV_DTYPE_BYTES = {
    "auto": 2,
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
    "int8_per_token_head": 1,
}
TP_EFFICIENCY = 0.9  # fraction of linear speedup kept per extra tensor-parallel GPU (all-reduce cost)


@dataclass(frozen=True)
class Hardware:
    """One engine instance: a model served on `tp` GPUs of one kind, with a KV cache dtype."""

    model: ModelPreset
    gpu: GpuPreset
    tp: int = 1
    kv_cache_dtype: str = "auto"

    @property
    def scale(self) -> float:
        """Effective number of GPUs' worth of FLOPs and bandwidth."""
        return self.tp * (TP_EFFICIENCY if self.tp > 1 else 1.0)


@dataclass(frozen=True)
class StepLoad:
    """What one engine step computes.

    prefill_attention_pairs is the sum over the step's prefill tokens of the context each attends to (see
    `chunk_attention_pairs`); decode_context_tokens is the sum of the decode sequences' context lengths.
    """

    prefill_tokens: int = 0
    prefill_attention_pairs: int = 0
    decode_seqs: int = 0
    decode_context_tokens: int = 0


def kv_dtype_bytes(kv_cache_dtype: str) -> int:
    """Bytes per KV element for a vLLM --kv-cache-dtype value (fp8/int8 halve bf16)."""
    try:
        return KV_DTYPE_BYTES[kv_cache_dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown kv cache dtype {kv_cache_dtype!r}") from None


def kv_bytes_per_token(model: ModelPreset, kv_cache_dtype: str = "auto") -> int:
    """KV cache bytes one token occupies: 2 (K and V) x layers x kv_heads x head_dim x dtype bytes."""
    return 2 * model.layers * model.kv_heads * model.head_dim * kv_dtype_bytes(kv_cache_dtype)


def weight_bytes(model: ModelPreset) -> float:
    """Bytes of model weights (all of them are read once per step)."""
    return model.params * model.weight_bytes_per_param


def kv_capacity_tokens(hw: Hardware, gpu_memory_utilization: float = 0.9) -> int:
    """Tokens of KV cache that fit: GPU memory x utilization - weights - per-GPU reserve, over bytes per token.

    Zero or less means the model does not fit (vLLM refuses to start in that case).
    """
    budget = hw.gpu.hbm_bytes * hw.tp * gpu_memory_utilization - weight_bytes(hw.model) - hw.gpu.reserved_bytes * hw.tp
    return max(0, int(budget // kv_bytes_per_token(hw.model, hw.kv_cache_dtype)))


def effective_max_model_len(model: ModelPreset, kv_capacity: int, configured: int | None = None) -> int:
    """Longest prompt + output an engine accepts: the configured (else the model's) context, capped by its KV cache."""
    return min(configured or model.max_model_len, kv_capacity)


def chunk_attention_pairs(context_before: int, chunk_tokens: int) -> int:
    """Sum of attended context lengths for a causal prefill chunk of `chunk_tokens` after `context_before` tokens."""
    return chunk_tokens * context_before + chunk_tokens * (chunk_tokens + 1) // 2


def step_time(hw: Hardware, load: StepLoad) -> float:
    """Seconds one engine step takes for a mixed batch of prefill chunk tokens and decode tokens."""
    seqs = load.decode_seqs + (1 if load.prefill_tokens else 0)
    if seqs == 0:
        return 0.0
    model = hw.model
    tokens = load.prefill_tokens + load.decode_seqs
    linear_flops = 2.0 * model.params * tokens
    attention_flops = (
        4.0
        * model.layers
        * model.attention_heads
        * model.head_dim
        * (load.prefill_attention_pairs + load.decode_context_tokens)
    )
    compute_s = (linear_flops + attention_flops) / (hw.gpu.peak_flops * hw.gpu.mfu * hw.scale)
    kv_read = kv_bytes_per_token(model, hw.kv_cache_dtype) * load.decode_context_tokens
    memory_s = (weight_bytes(model) + kv_read) / (hw.gpu.hbm_bandwidth * hw.gpu.bandwidth_efficiency * hw.scale)
    return max(compute_s, memory_s) + hw.gpu.step_overhead_s + hw.gpu.per_seq_overhead_s * seqs


def prefill_time(hw: Hardware, prompt_tokens: int, max_num_batched_tokens: int = 8192) -> float:
    """Seconds to prefill one prompt alone, in chunks of at most max_num_batched_tokens."""
    total, done = 0.0, 0
    while done < prompt_tokens:
        chunk = min(max_num_batched_tokens, prompt_tokens - done)
        total += step_time(
            hw, StepLoad(prefill_tokens=chunk, prefill_attention_pairs=chunk_attention_pairs(done, chunk))
        )
        done += chunk
    return total


def decode_step_time(hw: Hardware, batch_size: int, context_tokens: int) -> float:
    """Seconds of one decode step for `batch_size` sequences holding `context_tokens` KV tokens in total."""
    return step_time(hw, StepLoad(decode_seqs=batch_size, decode_context_tokens=context_tokens))


def kv_transfer_time(num_bytes: float, link: InterconnectPreset, parallel_links: int = 1) -> float:
    """Seconds to move `num_bytes` of KV blocks over `link` (latency plus bytes over achieved bandwidth).

    parallel_links: NICs reading at once; with one NIC per GPU that is min(prefill TP, decode TP).
    """
    if num_bytes <= 0:
        return 0.0
    return link.latency_s + num_bytes / (link.bandwidth * link.efficiency * max(1, parallel_links))


def transfer_link(
    src_rack: str, dst_rack: str, intra_rack: InterconnectPreset, cross_rack: InterconnectPreset
) -> InterconnectPreset:
    """The link a transfer uses: intra-rack when both instances share a (known) rack, else cross-rack."""
    return intra_rack if src_rack and src_rack == dst_rack else cross_rack


def blocks_for(tokens: int, block_size: int) -> int:
    """KV blocks needed to hold `tokens` tokens."""
    return math.ceil(tokens / block_size) if tokens > 0 else 0
