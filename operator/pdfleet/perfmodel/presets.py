"""Hardware and model presets for the engine timing model.

Figures come from vendor datasheets and model configs; docs/engine-emulator.md lists the sources. Efficiency factors
(MFU, bandwidth efficiency) are our assumptions, stated next to each preset.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class ModelPreset:
    """Shape of a decoder-only transformer: what the timing model needs to cost a step."""

    name: str
    params: float  # total parameters
    layers: int
    hidden: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    max_model_len: int
    weight_bytes_per_param: float = 2.0  # bf16 weights


@dataclass(frozen=True)
class GpuPreset:
    """One accelerator: dense bf16 peak, HBM bandwidth and size, and how much of each an engine really gets."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s (no sparsity)
    hbm_bandwidth: float  # bytes/s
    hbm_bytes: float
    mfu: float  # achieved fraction of peak FLOPs in large matmuls
    bandwidth_efficiency: float  # achieved fraction of HBM bandwidth when streaming weights/KV
    step_overhead_s: float = 0.0015  # scheduler + launch cost per engine step (CUDA graphs on)
    per_seq_overhead_s: float = 0.00001  # sampling/bookkeeping per sequence in a step
    reserved_bytes: float = 1.5 * GIB  # activations, CUDA context, NCCL buffers per GPU


@dataclass(frozen=True)
class InterconnectPreset:
    """A link KV blocks travel over between a prefill and a decode instance."""

    name: str
    bandwidth: float  # line rate, bytes/s
    efficiency: float  # achieved fraction of line rate for large RDMA reads
    latency_s: float  # one-way latency plus NIXL transfer setup


MODELS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset("qwen2.5-0.5b", 0.494e9, 24, 896, 14, 2, 64, 32768),
        ModelPreset("qwen2.5-1.5b", 1.54e9, 28, 1536, 12, 2, 128, 32768),
        ModelPreset("llama-3.1-8b", 8.03e9, 32, 4096, 32, 8, 128, 131072),
        ModelPreset("llama-3.1-70b", 70.6e9, 80, 8192, 64, 8, 128, 131072),
    )
}

GPUS: dict[str, GpuPreset] = {
    p.name: p
    for p in (
        GpuPreset("H100-SXM", 989e12, 3.35e12, 80 * GIB, mfu=0.50, bandwidth_efficiency=0.80),
        GpuPreset("H200", 989e12, 4.8e12, 141e9, mfu=0.50, bandwidth_efficiency=0.80),
        GpuPreset("A100-80G", 312e12, 2.039e12, 80 * GIB, mfu=0.55, bandwidth_efficiency=0.80),
        GpuPreset("A30", 165e12, 933e9, 24 * GIB, mfu=0.50, bandwidth_efficiency=0.75),
        GpuPreset("L4", 121e12, 300e9, 24e9, mfu=0.45, bandwidth_efficiency=0.75),
    )
}

INTERCONNECTS: dict[str, InterconnectPreset] = {
    p.name: p
    for p in (
        InterconnectPreset("nvlink4", 450e9, 0.80, 0.0002),  # same node, 900 GB/s bidirectional
        InterconnectPreset("ib-ndr400", 50e9, 0.85, 0.0005),  # one 400 Gb/s NIC per GPU, same leaf switch
        InterconnectPreset("spine-2to1", 25e9, 0.85, 0.0010),  # 400 Gb/s NIC through a 2:1 oversubscribed spine
        InterconnectPreset("roce-200", 25e9, 0.80, 0.0008),
        InterconnectPreset("tcp-100g", 12.5e9, 0.60, 0.0020),
    )
}

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_GPU = "H100-SXM"
DEFAULT_INTRA_RACK = "ib-ndr400"
DEFAULT_CROSS_RACK = "spine-2to1"

# HF-style model names and GPU product labels map onto presets by these patterns (checked in order).
_MODEL_PATTERNS = (
    (r"qwen2\.?5.*0\.5b", "qwen2.5-0.5b"),
    (r"qwen2\.?5.*1\.5b", "qwen2.5-1.5b"),
    (r"llama.*70b", "llama-3.1-70b"),
    (r"llama.*8b", "llama-3.1-8b"),
)
_GPU_PATTERNS = (
    (r"h100", "H100-SXM"),
    (r"h200", "H200"),
    (r"a100", "A100-80G"),
    (r"a30", "A30"),
    (r"l4", "L4"),
)


def _lookup(name: str, table: dict, patterns: tuple[tuple[str, str], ...], kind: str):
    lowered = name.strip().lower()
    for key, preset in table.items():
        if key.lower() == lowered:
            return preset
    for pattern, key in patterns:
        if re.search(pattern, lowered):
            return table[key]
    raise KeyError(f"unknown {kind} preset {name!r}; known: {', '.join(table)}")


def model_preset(name: str) -> ModelPreset:
    """Model preset by exact name (case-insensitive) or by an HF model id such as meta-llama/Llama-3.1-70B-Instruct."""
    return _lookup(name, MODELS, _MODEL_PATTERNS, "model")


def gpu_preset(name: str) -> GpuPreset:
    """GPU preset by exact name (case-insensitive) or by a GPU product label such as NVIDIA-H100-80GB-HBM3."""
    return _lookup(name, GPUS, _GPU_PATTERNS, "GPU")


def interconnect_preset(name: str) -> InterconnectPreset:
    """Interconnect preset by exact name (case-insensitive)."""
    return _lookup(name, INTERCONNECTS, (), "interconnect")


def guess_model_preset(model: str, fallback: str = DEFAULT_MODEL) -> ModelPreset:
    """The preset an HF model id implies, or the fallback when the id names no known family."""
    try:
        return model_preset(model)
    except KeyError:
        return model_preset(fallback)
