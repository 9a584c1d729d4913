"""Timing model and presets: formulas, monotonicity, orders of magnitude."""

import pytest

from pdfleet.perfmodel import presets
from pdfleet.perfmodel.timing import (
    Hardware,
    StepLoad,
    blocks_for,
    chunk_attention_pairs,
    decode_step_time,
    kv_bytes_per_token,
    kv_capacity_tokens,
    kv_transfer_time,
    prefill_time,
    step_time,
    transfer_link,
)

H100 = presets.gpu_preset("H100-SXM")
LLAMA8 = presets.model_preset("llama-3.1-8b")
LLAMA70 = presets.model_preset("llama-3.1-70b")


def test_kv_bytes_per_token_formula_and_quantization():
    # 2 (K,V) x 32 layers x 8 kv heads x 128 head dim x 2 bytes
    assert kv_bytes_per_token(LLAMA8) == 2 * 32 * 8 * 128 * 2 == 131072
    assert kv_bytes_per_token(LLAMA70) == 327680
    assert kv_bytes_per_token(LLAMA8, "fp8") == kv_bytes_per_token(LLAMA8, "int8") == 65536
    with pytest.raises(ValueError):
        kv_bytes_per_token(LLAMA8, "fp4")


def test_kv_capacity_from_memory_minus_weights():
    tokens = kv_capacity_tokens(Hardware(LLAMA8, H100), 0.9)
    assert 350_000 < tokens < 500_000  # vLLM reports ~4e5 tokens for Llama-3.1-8B on one H100 at 0.9
    assert kv_capacity_tokens(Hardware(LLAMA8, H100, kv_cache_dtype="fp8"), 0.9) == pytest.approx(2 * tokens, abs=2)
    assert kv_capacity_tokens(Hardware(LLAMA8, H100), 0.5) < tokens
    assert kv_capacity_tokens(Hardware(LLAMA70, H100, tp=1)) == 0  # 141 GB of weights do not fit in 80 GB
    assert kv_capacity_tokens(Hardware(LLAMA70, H100, tp=2)) > 0
    assert kv_capacity_tokens(Hardware(LLAMA8, presets.gpu_preset("L4"))) < 50_000


def test_prefill_70b_8k_on_h100_is_seconds():
    # TP1-equivalent compute (memory ignored by the timing function); 2*70.6e9*8192 FLOPs at 50% of 989 TFLOP/s
    seconds = prefill_time(Hardware(LLAMA70, H100), 8192)
    assert 1.0 < seconds < 3.0
    assert prefill_time(Hardware(LLAMA70, H100, tp=4), 8192) < seconds / 3


def test_prefill_monotonic_in_tokens_and_superlinear_from_attention():
    hw = Hardware(LLAMA8, H100)
    times = [prefill_time(hw, n) for n in (1, 128, 1024, 4096, 16384, 65536)]
    assert times == sorted(times)  # tiny prefills are memory bound (weights read once), so the start is flat
    compute_bound = times[2:]
    assert len(set(compute_bound)) == len(compute_bound)
    per_token_short = prefill_time(hw, 4096) / 4096
    per_token_long = prefill_time(hw, 65536) / 65536
    assert per_token_long > per_token_short  # attention grows with context


def test_chunked_prefill_costs_about_the_same_as_one_step():
    hw = Hardware(LLAMA8, H100)
    one = prefill_time(hw, 8192, max_num_batched_tokens=8192)
    chunked = prefill_time(hw, 8192, max_num_batched_tokens=2048)
    assert one < chunked < one * 1.2  # only extra step overheads


def test_decode_step_8b_h100_and_growth_with_batch_and_context():
    hw = Hardware(LLAMA8, H100)
    single = decode_step_time(hw, 1, 1000)
    assert 0.005 < single < 0.010  # weights 16 GB over ~2.7 TB/s + overhead
    batch64 = decode_step_time(hw, 64, 64 * 1000)
    assert single < batch64 < 2 * single  # memory bound: grows slowly with batch
    assert decode_step_time(hw, 64, 64 * 8000) > batch64  # more KV read
    sizes = [decode_step_time(hw, b, b * 2000) for b in (1, 8, 32, 128, 512)]
    assert sizes == sorted(sizes)


def test_step_time_mixed_batch_and_empty():
    hw = Hardware(LLAMA8, H100)
    assert step_time(hw, StepLoad()) == 0.0
    mixed = step_time(
        hw,
        StepLoad(
            prefill_tokens=2048,
            prefill_attention_pairs=chunk_attention_pairs(0, 2048),
            decode_seqs=32,
            decode_context_tokens=32 * 1000,
        ),
    )
    assert mixed > decode_step_time(hw, 32, 32 * 1000)


def test_chunk_attention_pairs_and_blocks():
    assert chunk_attention_pairs(0, 3) == 1 + 2 + 3
    assert chunk_attention_pairs(10, 2) == 11 + 12
    assert blocks_for(0, 16) == 0 and blocks_for(1, 16) == 1 and blocks_for(16, 16) == 1 and blocks_for(17, 16) == 2


def test_transfer_time_and_locality():
    intra = presets.interconnect_preset("ib-ndr400")
    cross = presets.interconnect_preset("spine-2to1")
    assert transfer_link("a", "a", intra, cross) is intra
    assert transfer_link("a", "b", intra, cross) is cross
    assert transfer_link("", "", intra, cross) is cross  # unknown racks are not assumed local
    num_bytes = 8192 * kv_bytes_per_token(LLAMA70)  # 2.7 GB for an 8K prompt
    assert kv_transfer_time(0, intra) == 0.0
    assert 0.03 < kv_transfer_time(num_bytes, intra) < 0.1
    assert kv_transfer_time(num_bytes, cross) > kv_transfer_time(num_bytes, intra)
    assert kv_transfer_time(2 * num_bytes, intra) > kv_transfer_time(num_bytes, intra)
    assert kv_transfer_time(num_bytes, intra, parallel_links=4) < kv_transfer_time(num_bytes, intra) / 3


def test_presets_sane_and_lookup_by_product_names():
    order = [presets.gpu_preset(n) for n in ("H100-SXM", "A100-80G", "A30", "L4")]
    assert [g.peak_flops for g in order] == sorted((g.peak_flops for g in order), reverse=True)
    assert [g.hbm_bandwidth for g in order] == sorted((g.hbm_bandwidth for g in order), reverse=True)
    for gpu in presets.GPUS.values():
        assert 0 < gpu.mfu <= 0.7 and 0 < gpu.bandwidth_efficiency <= 0.9
    for model in presets.MODELS.values():
        assert model.attention_heads % model.kv_heads == 0
    assert presets.gpu_preset("NVIDIA-H100-80GB-HBM3").name == "H100-SXM"
    assert presets.gpu_preset("NVIDIA-A100-SXM4-80GB").name == "A100-80G"
    assert presets.model_preset("meta-llama/Llama-3.1-70B-Instruct").name == "llama-3.1-70b"
    assert presets.model_preset("Qwen/Qwen2.5-0.5B-Instruct").name == "qwen2.5-0.5b"
    assert presets.guess_model_preset("some/unknown-model").name == presets.DEFAULT_MODEL
    with pytest.raises(KeyError):
        presets.gpu_preset("TPU-v5")
