"""Real vLLM on this machine: where `.ci/install-vllm.sh` put it, and what a CPU-only engine needs.

The install script builds a virtualenv with vLLM's CPU build and NIXL, and a tiny random-weight Llama, under the
pdfleet cache. Local fleets run the operator's rendered `vllm serve ...` command with that venv's `vllm`; everything a
CPU needs beyond it (float32, eager mode, a small KV cache space, NIXL over TCP on loopback with CPU buffers) is set
through the PDDeployment's own `engine.args`, `engine.env` and `kvTransfer`, never by changing what is rendered.
"""

from __future__ import annotations

import json
from pathlib import Path

from pdfleet.localfleet.controlplane import cache_dir

INSTALL_SCRIPT = ".ci/install-vllm.sh"
# vLLM flags a CPU engine with the tiny model needs: float32 (no bf16 kernels needed), no graph capture, a context and
# batch that fit the 1 GiB KV cache space below
CPU_ENGINE_ARGS: tuple[str, ...] = (
    "--dtype", "float32", "--enforce-eager", "--max-model-len", "2048", "--max-num-seqs", "8",
)  # fmt: skip
# GiB of KV cache per engine; no hub lookups; threads float over the cores instead of both engines pinning core 0
CPU_ENGINE_ENV: dict[str, str] = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}
# kvTransfer fields for NIXL between CPU engines on one machine: host buffers, UCX over TCP on loopback
CPU_KV_TRANSFER: dict[str, object] = {
    "connector": "nixl",
    "bufferDevice": "cpu",
    "ucxTransports": ["tcp", "self", "sm"],
    "ucxNetDevices": ["lo"],
}


def vllm_venv() -> Path:
    """The virtualenv the install script builds."""
    return cache_dir() / "vllm-venv"


def vllm_executable() -> Path:
    """The venv's `vllm` command (what the rendered `vllm serve` runs as)."""
    return vllm_venv() / "bin" / "vllm"


def tiny_model_dir() -> Path:
    """The tiny Llama the install script builds (scripts/make_tiny_llama.py)."""
    return cache_dir() / "models" / "tiny-llama"


SERVED_MODEL_NAME = "tiny-llama"
VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"  # what a cluster would pull; the local runner maps it to the venv's vllm


# A CPU engine's first request warms its kernels for seconds (a prefill missed /health for 16 s on 2 busy cores), so
# the leg timeouts derived from a GPU-sized SLA would hold healthy engines out: the router waits as long as a client.
CPU_ROUTER_POLICY = {"firstByteTimeoutSeconds": 120, "interChunkTimeoutSeconds": 60}


def pdd_spec_fields(**router_policy: object) -> dict[str, object]:
    """The `model`, `engine`, `kvTransfer` and `router` of a PDDeployment that runs real vLLM on this machine's CPUs;
    `router_policy` adds to (or overrides) CPU_ROUTER_POLICY."""
    return {
        "router": {"policy": {**CPU_ROUTER_POLICY, **router_policy}},
        "model": {"name": str(tiny_model_dir()), "servedModelName": SERVED_MODEL_NAME},
        "engine": {
            "kind": "vllm",
            "image": VLLM_IMAGE,
            "args": list(CPU_ENGINE_ARGS),
            "env": [{"name": name, "value": value} for name, value in CPU_ENGINE_ENV.items()],
        },
        "kvTransfer": dict(CPU_KV_TRANSFER),
    }


def tiny_model_vocab_size() -> int:
    """Token ids the tiny model accepts are below this (its config's vocab_size)."""
    return int(json.loads((tiny_model_dir() / "config.json").read_text())["vocab_size"])


def missing() -> str | None:
    """Why real vLLM cannot run here (None when the venv and the model are installed)."""
    if not vllm_executable().is_file():
        return f"real vLLM is not installed at {vllm_venv()} (bash {INSTALL_SCRIPT})"
    if not (tiny_model_dir() / "config.json").is_file():
        return f"the tiny model is missing at {tiny_model_dir()} (bash {INSTALL_SCRIPT})"
    return None
