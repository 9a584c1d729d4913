"""Engine command lines for vLLM and SGLang, prefill and decode."""

from __future__ import annotations

import json

import pytest

from pdfleet.api.model import parse_spec
from pdfleet.render.engine_args import render_engine_command


def spec_of(**sections: object):
    return parse_spec(
        {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedModelName": "llama-8b"}, **sections}
    )


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


@pytest.mark.parametrize("dtype", ["fp8", "int8"])
def test_vllm_quantized_kv_cache(dtype: str) -> None:
    _, args = render_engine_command(spec_of(kvTransfer={"cacheDtype": dtype}), "prefill")
    assert flag(args, "--kv-cache-dtype") == dtype


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
