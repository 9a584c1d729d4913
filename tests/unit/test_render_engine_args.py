"""Engine command lines for vLLM and SGLang, prefill and decode."""

from __future__ import annotations

import json

import pytest

from pdfleet.render.engine_args import (
    VLLM_KV_ROLES,
    kv_transfer_config,
    render_engine_command,
    render_kv_transfer_env,
    render_kv_transfer_ports,
)
from pdfleet.testing.builders import minimal_spec


def spec_of(**sections: object):
    return minimal_spec(served_name="llama-8b", **sections)


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize(("pool", "role"), [("prefill", "kv_producer"), ("decode", "kv_consumer")])
def test_vllm_serve_with_kv_role(pool: str, role: str) -> None:
    command, args = render_engine_command(spec_of(), pool)
    assert command == ["vllm", "serve"]
    assert args[:5] == ["meta-llama/Llama-3.1-8B-Instruct", "--port", "8000", "--served-model-name", "llama-8b"]
    assert json.loads(flag(args, "--kv-transfer-config")) == {"kv_connector": "NixlConnector", "kv_role": role}
    assert "--kv-cache-dtype" not in args and "--tensor-parallel-size" not in args


@pytest.mark.parametrize(
    ("connector", "name"),
    [("nixl", "NixlConnector"), ("mooncake", "MooncakeConnector"), ("lmcache", "LMCacheConnectorV1")],
)
def test_vllm_connectors(connector: str, name: str) -> None:
    _, args = render_engine_command(spec_of(kvTransfer={"connector": connector}), "decode")
    assert json.loads(flag(args, "--kv-transfer-config"))["kv_connector"] == name


# vLLM 0.32's --kv-cache-dtype has no plain "int8" (its parser rejects it): the int8 cache is int8_per_token_head.
@pytest.mark.parametrize(("dtype", "vllm_dtype"), [("fp8", "fp8"), ("int8", "int8_per_token_head")])
def test_vllm_quantized_kv_cache(dtype: str, vllm_dtype: str) -> None:
    _, args = render_engine_command(spec_of(kvTransfer={"cacheDtype": dtype}), "prefill")
    assert flag(args, "--kv-cache-dtype") == vllm_dtype


@pytest.mark.parametrize("pool", ["prefill", "decode"])
def test_vllm_buffer_device_reaches_the_kv_transfer_config(pool: str) -> None:
    _, args = render_engine_command(spec_of(kvTransfer={"bufferDevice": "cpu"}), pool)
    config = json.loads(flag(args, "--kv-transfer-config"))
    assert config == {"kv_connector": "NixlConnector", "kv_role": VLLM_KV_ROLES[pool], "kv_buffer_device": "cpu"}
    assert flag(args, "--kv-transfer-config") == kv_transfer_config(spec_of(kvTransfer={"bufferDevice": "cpu"}), pool)


def test_vllm_mooncake_protocol_goes_to_the_extra_config() -> None:
    spec = spec_of(kvTransfer={"connector": "mooncake", "mooncakeProtocol": "tcp"})
    config = json.loads(flag(render_engine_command(spec, "decode")[1], "--kv-transfer-config"))
    assert config == {
        "kv_connector": "MooncakeConnector",
        "kv_role": "kv_consumer",
        "kv_connector_extra_config": {"mooncake_protocol": "tcp"},
    }


def env_of(spec, pool: str) -> dict[str, dict]:
    return {var["name"]: var for var in render_kv_transfer_env(spec, pool)}


POD_IP = {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}


@pytest.mark.parametrize("pool", ["prefill", "decode"])
def test_nixl_env_advertises_the_pod_ip_and_side_channel_port(pool: str) -> None:
    env = env_of(spec_of(), pool)
    assert env["VLLM_HOST_IP"]["valueFrom"] == POD_IP
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == POD_IP
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": "5600"}
    assert "UCX_TLS" not in env and "UCX_NET_DEVICES" not in env and "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in env
    assert render_kv_transfer_ports(spec_of(), pool) == [
        {"name": "nixl-side", "containerPort": 5600, "protocol": "TCP"}
    ]


def test_nixl_side_channel_port_and_ucx_settings() -> None:
    spec = spec_of(
        kvTransfer={"sideChannelPort": 7000, "ucxTransports": ["tcp", "sm", "self"], "ucxNetDevices": ["eth0", "lo"]}
    )
    env = env_of(spec, "decode")
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == "7000"
    assert env["UCX_TLS"] == {"name": "UCX_TLS", "value": "tcp,sm,self"}
    assert env["UCX_NET_DEVICES"] == {"name": "UCX_NET_DEVICES", "value": "eth0,lo"}
    assert render_kv_transfer_ports(spec, "decode") == [{"name": "nixl-side", "containerPort": 7000, "protocol": "TCP"}]


def test_mooncake_bootstrap_port_only_on_prefill() -> None:
    spec = spec_of(kvTransfer={"connector": "mooncake", "bootstrapPort": 9000})
    prefill, decode = env_of(spec, "prefill"), env_of(spec, "decode")
    assert prefill["VLLM_MOONCAKE_BOOTSTRAP_PORT"]["value"] == "9000"
    assert "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in decode
    for env in (prefill, decode):
        assert env["VLLM_HOST_IP"]["valueFrom"] == POD_IP  # the Mooncake worker advertises get_ip()
        assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in env
    assert render_kv_transfer_ports(spec, "prefill") == [
        {"name": "mooncake-boot", "containerPort": 9000, "protocol": "TCP"}
    ]
    assert render_kv_transfer_ports(spec, "decode") == []
    default = spec_of(kvTransfer={"connector": "mooncake"})
    assert env_of(default, "prefill")["VLLM_MOONCAKE_BOOTSTRAP_PORT"]["value"] == "8998"


def test_lmcache_env_is_the_users_besides_host_ip_and_ucx() -> None:
    spec = spec_of(kvTransfer={"connector": "lmcache", "ucxTransports": ["cuda_ipc", "cuda_copy", "tcp"]})
    assert set(env_of(spec, "prefill")) == {"VLLM_HOST_IP", "UCX_TLS"}
    assert render_kv_transfer_ports(spec, "prefill") == []


def test_declared_port_follows_a_users_literal_port() -> None:
    spec = spec_of(engine={"env": [{"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": "6100"}]})
    assert render_kv_transfer_ports(spec, "prefill")[0]["containerPort"] == 6100


@pytest.mark.parametrize("pool", ["prefill", "decode"])
def test_sglang_gets_no_vllm_env_or_ports(pool: str) -> None:
    spec = spec_of(engine={"kind": "sglang"}, kvTransfer={"connector": "mooncake"})
    assert render_kv_transfer_env(spec, pool) == [] and render_kv_transfer_ports(spec, pool) == []


def test_extra_args_come_last_and_tensor_parallel_follows_gpus() -> None:
    spec = spec_of(engine={"args": ["--max-model-len", "8192"]}, decode={"gpusPerReplica": 4})
    _, args = render_engine_command(spec, "decode")
    assert args[-2:] == ["--max-model-len", "8192"]
    assert flag(args, "--tensor-parallel-size") == "4"


@pytest.mark.parametrize("pool", ["prefill", "decode"])
def test_sglang_launch_server(pool: str) -> None:
    spec = spec_of(
        engine={"kind": "sglang", "port": 30000},
        kvTransfer={"connector": "mooncake", "cacheDtype": "fp8"},
        prefill={"gpusPerReplica": 2},
    )
    command, args = render_engine_command(spec, pool)
    assert command == ["python", "-m", "sglang.launch_server"]
    assert flag(args, "--model-path") == "meta-llama/Llama-3.1-8B-Instruct"
    assert (flag(args, "--port"), flag(args, "--host"), flag(args, "--served-model-name")) == (
        "30000",
        "0.0.0.0",
        "llama-8b",
    )
    assert flag(args, "--disaggregation-mode") == pool
    assert flag(args, "--disaggregation-transfer-backend") == "mooncake"
    assert flag(args, "--kv-cache-dtype") == "fp8_e5m2"
    assert ("--tp-size" in args) == (pool == "prefill")
    assert "--kv-transfer-config" not in args


def test_same_spec_same_bytes() -> None:
    assert render_engine_command(spec_of(), "prefill") == render_engine_command(spec_of(), "prefill")
