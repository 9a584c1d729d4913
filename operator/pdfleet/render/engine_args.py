"""Engine command lines, KV-transfer environment and ports for prefill and decode pods (vLLM and SGLang forms of
docs/architecture.md).

Every vLLM flag, env var and JSON key here is one vLLM 0.32 reads (vllm/envs.py, vllm/config/kv_transfer.py, the
NIXL and Mooncake connectors); tests/unit/test_render_vllm_cli.py parses the rendered command lines with vLLM's own
argument parser.
"""

from __future__ import annotations

import json
from typing import Any

from pdfleet.api.model import PDDeploymentSpec
from pdfleet.render.meta import field_env

VLLM_CONNECTORS = {"nixl": "NixlConnector", "mooncake": "MooncakeConnector", "lmcache": "LMCacheConnectorV1"}
VLLM_KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}
# vLLM 0.32's --kv-cache-dtype has no plain int8: its int8 KV cache is int8_per_token_head (per-token-head scales).
VLLM_CACHE_DTYPES = {"fp8": "fp8", "int8": "int8_per_token_head"}
# SGLang names its only fp8 KV format explicitly; model validation rejects int8 for SGLang.
SGLANG_CACHE_DTYPES = {"fp8": "fp8_e5m2"}
# SGLang binds 127.0.0.1 unless told otherwise; vLLM already listens on all interfaces.
ALL_INTERFACES = "0.0.0.0"
# Container port names (IANA service names: at most 15 characters).
NIXL_SIDE_CHANNEL_PORT_NAME = "nixl-side"
MOONCAKE_BOOTSTRAP_PORT_NAME = "mooncake-boot"
POD_IP_FIELD = "status.podIP"


def kv_transfer_config(spec: PDDeploymentSpec, pool: str) -> str:
    """vLLM's --kv-transfer-config JSON for `pool` (compact, sorted keys: the same spec gives the same bytes)."""
    kv = spec.kv_transfer
    config: dict[str, Any] = {"kv_connector": VLLM_CONNECTORS[kv.connector], "kv_role": VLLM_KV_ROLES[pool]}
    if kv.buffer_device is not None:
        config["kv_buffer_device"] = kv.buffer_device
    extra: dict[str, Any] = {}
    if kv.mooncake_protocol is not None:
        extra["mooncake_protocol"] = kv.mooncake_protocol
    if extra:
        config["kv_connector_extra_config"] = extra
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def _vllm(spec: PDDeploymentSpec, pool: str) -> tuple[list[str], list[str]]:
    args = [
        spec.model.name,
        "--port", str(spec.engine.port),
        "--served-model-name", spec.model.served_name,
        "--kv-transfer-config", kv_transfer_config(spec, pool),
    ]  # fmt: skip
    if spec.kv_transfer.cache_dtype != "auto":
        args += ["--kv-cache-dtype", VLLM_CACHE_DTYPES[spec.kv_transfer.cache_dtype]]
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


def _listens_for_mooncake_bootstrap(spec: PDDeploymentSpec, pool: str) -> bool:
    # Only a kv_producer starts the Mooncake bootstrap server (MooncakeConnectorWorker); decode dials it.
    return spec.engine.kind == "vllm" and spec.kv_transfer.connector == "mooncake" and pool == "prefill"


def render_kv_transfer_env(spec: PDDeploymentSpec, pool: str) -> list[dict[str, Any]]:
    """The env vars vLLM's KV connector needs in a pod of `pool` (none for SGLang).

    VLLM_HOST_IP: the address vLLM advertises (get_ip(); the Mooncake worker's transfer address). NIXL: the side
    channel's host (without it a prefill tells every decode to dial "localhost") and port. Mooncake: the prefill's
    bootstrap server port. UCX_TLS / UCX_NET_DEVICES from kvTransfer.ucxTransports / ucxNetDevices.
    """
    if spec.engine.kind != "vllm":
        return []
    kv = spec.kv_transfer
    env = [field_env("VLLM_HOST_IP", POD_IP_FIELD)]
    if kv.connector == "nixl":
        env.append(field_env("VLLM_NIXL_SIDE_CHANNEL_HOST", POD_IP_FIELD))
        env.append({"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(kv.effective_side_channel_port)})
    if _listens_for_mooncake_bootstrap(spec, pool):
        env.append({"name": "VLLM_MOONCAKE_BOOTSTRAP_PORT", "value": str(kv.effective_bootstrap_port)})
    if kv.ucx_transports:
        env.append({"name": "UCX_TLS", "value": ",".join(kv.ucx_transports)})
    if kv.ucx_net_devices:
        env.append({"name": "UCX_NET_DEVICES", "value": ",".join(kv.ucx_net_devices)})
    return env


def _user_port(spec: PDDeploymentSpec, name: str, default: int) -> int:
    """The port a literal engine.env variable `name` sets (a user variable wins over pdfleet's), else `default`."""
    for var in spec.engine.env:
        if var.name == name and var.value is not None and var.value.strip().isdigit():
            return int(var.value)
    return default


def render_kv_transfer_ports(spec: PDDeploymentSpec, pool: str) -> list[dict[str, Any]]:
    """Container ports the KV connector listens on in a pod of `pool`, besides the engine's HTTP port."""
    if spec.engine.kind != "vllm":
        return []
    kv = spec.kv_transfer
    ports = []
    if kv.connector == "nixl":
        port = _user_port(spec, "VLLM_NIXL_SIDE_CHANNEL_PORT", kv.effective_side_channel_port)
        ports.append({"name": NIXL_SIDE_CHANNEL_PORT_NAME, "containerPort": port, "protocol": "TCP"})
    if _listens_for_mooncake_bootstrap(spec, pool):
        port = _user_port(spec, "VLLM_MOONCAKE_BOOTSTRAP_PORT", kv.effective_bootstrap_port)
        ports.append({"name": MOONCAKE_BOOTSTRAP_PORT_NAME, "containerPort": port, "protocol": "TCP"})
    return ports
