"""The `vllm serve` flags that shape an engine's performance, parsed the way vLLM reads them.

One parser serves the emulator (which accepts `vllm serve` arguments unchanged) and the replica model of a fleet
(whose batch limits come from `spec.engine.args`), so the two cannot read the same flag differently.
"""

from __future__ import annotations

import argparse
from typing import Any

# vLLM's defaults for the flags that bound a replica's batches
BATCH_LIMIT_DEFAULTS: dict[str, Any] = {
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
    "gpu_memory_utilization": 0.9,
}


def add_vllm_serve_arguments(group: argparse._ActionsContainer) -> None:
    """Add the `vllm serve` flags the emulator and the replica model read (vLLM's defaults) to a parser or group."""
    group.add_argument("--model", dest="model_flag", help="model to serve (instead of the positional model)")
    group.add_argument("--host", default="0.0.0.0", help="address to listen on")
    group.add_argument("--port", type=int, default=8000, help="HTTP port")
    group.add_argument("--served-model-name", nargs="+", help="names clients use (default: the model)")
    group.add_argument("--kv-transfer-config", help="KVTransferConfig JSON (kv_connector, kv_role, ...)")
    group.add_argument("--kv-cache-dtype", default="auto", help="KV cache data type")
    group.add_argument(
        "--max-num-seqs", type=int, default=BATCH_LIMIT_DEFAULTS["max_num_seqs"], help="sequences per batch at most"
    )
    group.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=BATCH_LIMIT_DEFAULTS["max_num_batched_tokens"],
        help="tokens per batch at most",
    )
    group.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=BATCH_LIMIT_DEFAULTS["gpu_memory_utilization"],
        help="share of GPU memory for weights and KV cache",
    )
    group.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, help="GPUs per replica")
    group.add_argument("--max-model-len", type=int, help="context length (default: the model's)")
    group.add_argument("--block-size", type=int, default=16, help="tokens per KV cache block")
    group.add_argument(
        "--kv-load-failure-policy", choices=("fail", "recompute"), help="what a decode does when a KV pull fails"
    )


def vllm_batch_limits(args: list[str]) -> dict[str, Any]:
    """max_num_seqs, max_num_batched_tokens and gpu_memory_utilization as `vllm serve` reads them from `args` (vLLM's
    defaults where absent; all defaults when a value is malformed, since vLLM would not start with it)."""
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False, add_help=False)
    add_vllm_serve_arguments(parser)
    try:
        parsed, _ = parser.parse_known_args(args)
    except argparse.ArgumentError:
        return dict(BATCH_LIMIT_DEFAULTS)
    return {name: getattr(parsed, name) for name in BATCH_LIMIT_DEFAULTS}
