"""Engine command lines for prefill and decode pods (vLLM and SGLang forms of docs/architecture.md)."""

from __future__ import annotations

import json

from pdfleet.api.model import PDDeploymentSpec

VLLM_CONNECTORS = {"nixl": "NixlConnector", "mooncake": "MooncakeConnector", "lmcache": "LMCacheConnectorV1"}
VLLM_KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}
# SGLang names its only fp8 KV format explicitly; model validation rejects int8 for SGLang.
SGLANG_CACHE_DTYPES = {"fp8": "fp8_e5m2"}
# SGLang binds 127.0.0.1 unless told otherwise; vLLM already listens on all interfaces.
ALL_INTERFACES = "0.0.0.0"


def kv_transfer_config(spec: PDDeploymentSpec, pool: str) -> str:
    """vLLM's --kv-transfer-config JSON for `pool` (compact, sorted keys: the same spec gives the same bytes)."""
    config = {"kv_connector": VLLM_CONNECTORS[spec.kv_transfer.connector], "kv_role": VLLM_KV_ROLES[pool]}
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def _vllm(spec: PDDeploymentSpec, pool: str) -> tuple[list[str], list[str]]:
    args = [
        spec.model.name,
        "--port", str(spec.engine.port),
        "--served-model-name", spec.model.served_name,
        "--kv-transfer-config", kv_transfer_config(spec, pool),
    ]  # fmt: skip
    if spec.kv_transfer.cache_dtype != "auto":
        args += ["--kv-cache-dtype", spec.kv_transfer.cache_dtype]
    if spec.pool(pool).gpus_per_replica > 1:
        args += ["--tensor-parallel-size", str(spec.pool(pool).gpus_per_replica)]
    return ["vllm", "serve"], args


def _sglang(spec: PDDeploymentSpec, pool: str) -> tuple[list[str], list[str]]:
    args = [
        "--model-path", spec.model.name,
        "--host", ALL_INTERFACES,
        "--port", str(spec.engine.port),
        "--served-model-name", spec.model.served_name,
        "--disaggregation-mode", pool,
        "--disaggregation-transfer-backend", spec.kv_transfer.connector,
    ]  # fmt: skip
    if spec.kv_transfer.cache_dtype != "auto":
        args += ["--kv-cache-dtype", SGLANG_CACHE_DTYPES[spec.kv_transfer.cache_dtype]]
    if spec.pool(pool).gpus_per_replica > 1:
        args += ["--tp-size", str(spec.pool(pool).gpus_per_replica)]
    return ["python", "-m", "sglang.launch_server"], args


def render_engine_command(spec: PDDeploymentSpec, pool: str) -> tuple[list[str], list[str]]:
    """(command, args) of the engine container of `pool` ("prefill" or "decode"); spec.engine.args come last."""
    command, args = (_vllm if spec.engine.kind == "vllm" else _sglang)(spec, pool)
    return command, args + list(spec.engine.args)
