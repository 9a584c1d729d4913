"""The rendered vLLM command lines and env, read by vLLM itself: its own `vllm serve` argument parser, the
KVTransferConfig that parser builds, and vllm.envs for the env vars, so the renderer and vLLM cannot drift.

Needs the real vLLM of `.ci/install-vllm.sh` ($PDFLEET_CACHE/vllm-venv, default ~/.cache/pdfleet); without it the
tests skip locally and fail in CI. Importing vLLM takes 10-20 s, so every command line of the module is parsed in one
subprocess of that venv's python (the module-scoped fixture `parsed`).
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from pdfleet.localfleet import real_vllm
from pdfleet.render.meta import Owner
from pdfleet.render.statefulset import render_cell_statefulset
from pdfleet.testing.builders import minimal_spec
from pdfleet.testing.prerequisites import missing_prerequisite
from pdfleet.topology.placement import Cell

VLLM_PYTHON = real_vllm.vllm_venv() / "bin" / "python"
OWNER = Owner(name="llama", namespace="inference", uid="u")
POD_IP = "10.1.2.3"  # what the downward API's status.podIP gives the pod
RESULT_MARK = "PDFLEET-VLLM-PARSE "

# Runs in the vLLM venv. stdin: {"cases": {id: {"argv": [...], "env": {name: value}}}}. For each case: parse argv
# (`vllm serve ...`) with vLLM's own serve parser and its validation, as `vllm serve` does; build the engine args and
# report what vLLM read, its KVTransferConfig, and whether vLLM's connector factory knows the connector; then read the
# case's VLLM_* env through vllm.envs (with the env set) and vLLM's get_ip(). One line on stdout, after RESULT_MARK
# (vLLM's logs may share stdout).
VLLM_PARSE_SCRIPT = (
    r"""
import contextlib, io, json, os, sys

from vllm import envs
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.utils.network_utils import get_ip

parser = FlexibleArgumentParser(prog="vllm")
serve = ServeSubcommand()
serve.subparser_init(parser.add_subparsers(dest="subparser"))
KV_FIELDS = ("kv_connector", "kv_role", "kv_buffer_device", "kv_connector_extra_config", "kv_load_failure_policy")


def parse(argv):
    if argv[:2] != ["vllm", "serve"]:
        return {"ok": False, "error": f"not a `vllm serve` command: {argv[:2]}"}
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv[1:])
            serve.validate(args)
    except SystemExit:
        return {"ok": False, "error": err.getvalue().strip()}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    args.model = args.model_tag  # what ServeSubcommand.cmd does with the positional model
    engine = AsyncEngineArgs.from_cli_args(args)
    kv = engine.kv_transfer_config
    assert isinstance(kv, KVTransferConfig), type(kv)
    return {
        "ok": True,
        "model": engine.model,
        "port": args.port,
        "served_model_name": engine.served_model_name,
        "tensor_parallel_size": engine.tensor_parallel_size,
        "kv_cache_dtype": engine.kv_cache_dtype,
        "max_num_seqs": engine.max_num_seqs,
        "max_model_len": engine.max_model_len,
        "enforce_eager": engine.enforce_eager,
        "dtype": engine.dtype,
        "kv_transfer_config": {name: getattr(kv, name) for name in KV_FIELDS},
        "is_kv_producer": kv.is_kv_producer,
        "is_kv_consumer": kv.is_kv_consumer,
        "connector_registered": kv.kv_connector in KVConnectorFactory._registry,
    }


def read_env(env):
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        known = envs.environment_variables
        names = sorted(name for name in env if name.startswith("VLLM_"))
        return {
            "unknown": [name for name in names if name not in known],
            "values": {name: known[name]() for name in names if name in known},
            "get_ip": get_ip(),
        }
    finally:
        os.environ.clear()
        os.environ.update(saved)


cases = json.load(sys.stdin)["cases"]
result = {key: {"cli": parse(case["argv"]), "env": read_env(case["env"])} for key, case in cases.items()}
print(%r + json.dumps(result), flush=True)
"""
    % RESULT_MARK
)

SPECS: dict[str, dict[str, Any]] = {
    "nixl": {},
    "nixl-cpu-tcp": {
        "kvTransfer": {
            "bufferDevice": "cpu",
            "sideChannelPort": 5700,
            "ucxTransports": ["tcp", "sm", "self"],
            "ucxNetDevices": ["eth0"],
        }
    },
    "tp2-fp8": {"prefill": {"gpusPerReplica": 2}, "decode": {"gpusPerReplica": 2}, "kvTransfer": {"cacheDtype": "fp8"}},
    "int8": {"kvTransfer": {"cacheDtype": "int8"}},
    "mooncake": {"kvTransfer": {"connector": "mooncake", "mooncakeProtocol": "tcp", "bootstrapPort": 9000}},
    "lmcache": {"kvTransfer": {"connector": "lmcache"}},
    "user-args": {
        "engine": {
            "port": 8100,
            "args": ["--max-num-seqs", "8", "--enforce-eager", "--dtype", "float32", "--max-model-len", "2048"],
        }
    },
}
# Command lines vLLM must reject: proof that the check bites.
BAD_COMMANDS = {
    "unknown-flag": ["vllm", "serve", "m", "--no-such-flag", "1"],
    "plain-int8-kv-cache": ["vllm", "serve", "m", "--kv-cache-dtype", "int8"],  # what pdfleet rendered for vLLM 0.11
    "misspelled-kv-key": [
        "vllm",
        "serve",
        "m",
        "--kv-transfer-config",
        '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_buffer_devic":"cpu"}',
    ],
}


def spec_of(case: str):
    return minimal_spec(served_name="llama-8b", **SPECS[case])


def container_of(case: str, pool: str) -> dict[str, Any]:
    cell = Cell(pool=pool, rack="rack-a", zone="zone-1", replicas=1, name=f"llama-{pool}-rack-a")
    (container,) = render_cell_statefulset(OWNER, spec_of(case), cell)["spec"]["template"]["spec"]["containers"]
    return container


def env_values(container: dict[str, Any]) -> dict[str, str]:
    """The container's env as the pod sees it (downward-API pod IP filled in; other sources left out)."""
    values = {}
    for var in container["env"]:
        if "value" in var:
            values[var["name"]] = var["value"]
        elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            values[var["name"]] = POD_IP
    return values


@pytest.fixture(scope="module")
def parsed() -> dict[str, Any]:
    if not VLLM_PYTHON.exists():
        missing_prerequisite(f"real vLLM is not installed at {VLLM_PYTHON} (run .ci/install-vllm.sh)")
    cases = {}
    for case in SPECS:
        for pool in ("prefill", "decode"):
            container = container_of(case, pool)
            cases[f"{case}/{pool}"] = {"argv": container["command"] + container["args"], "env": env_values(container)}
    for name, argv in BAD_COMMANDS.items():
        cases[f"bad/{name}"] = {"argv": argv, "env": {}}
    # Parsing needs no model files; with HF_HUB_OFFLINE set, vLLM's EngineArgs would look the model up in the HF cache.
    env = {key: value for key, value in os.environ.items() if not key.startswith(("VLLM_", "UCX_", "HF_HUB_OFFLINE"))}
    done = subprocess.run(
        [str(VLLM_PYTHON), "-c", VLLM_PARSE_SCRIPT],
        input=json.dumps({"cases": cases}),
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
    assert done.returncode == 0 and lines, f"vLLM parse script failed ({done.returncode}):\n{done.stderr[-4000:]}"
    return json.loads(lines[-1].removeprefix(RESULT_MARK))


def cli(parsed: dict[str, Any], case: str, pool: str) -> dict[str, Any]:
    result = parsed[f"{case}/{pool}"]["cli"]
    assert result["ok"], f"vLLM rejected the rendered {case} {pool} command: {result['error']}"
    return result


@pytest.mark.parametrize("case", list(SPECS))
@pytest.mark.parametrize("pool", ["prefill", "decode"])
def test_vllm_accepts_the_rendered_command(parsed: dict[str, Any], case: str, pool: str) -> None:
    spec = spec_of(case)
    got = cli(parsed, case, pool)
    assert (got["model"], got["served_model_name"], got["port"]) == (spec.model.name, ["llama-8b"], spec.engine.port)
    kv = got["kv_transfer_config"]
    connector = {"nixl": "NixlConnector", "mooncake": "MooncakeConnector", "lmcache": "LMCacheConnectorV1"}
    assert kv["kv_connector"] == connector[spec.kv_transfer.connector]
    assert got["connector_registered"], f"vLLM has no KV connector named {kv['kv_connector']}"
    assert kv["kv_role"] == {"prefill": "kv_producer", "decode": "kv_consumer"}[pool]
    assert (got["is_kv_producer"], got["is_kv_consumer"]) == (pool == "prefill", pool == "decode")
    assert got["tensor_parallel_size"] == spec.pool(pool).gpus_per_replica


def test_buffer_device_and_extra_config_reach_vllms_kv_transfer_config(parsed: dict[str, Any]) -> None:
    for pool in ("prefill", "decode"):
        assert cli(parsed, "nixl-cpu-tcp", pool)["kv_transfer_config"]["kv_buffer_device"] == "cpu"
        mooncake = cli(parsed, "mooncake", pool)["kv_transfer_config"]
        assert mooncake["kv_connector_extra_config"] == {"mooncake_protocol": "tcp"}
        assert cli(parsed, "nixl", pool)["kv_transfer_config"]["kv_connector_extra_config"] == {}


def test_quantized_kv_cache_and_tensor_parallel(parsed: dict[str, Any]) -> None:
    assert cli(parsed, "tp2-fp8", "decode")["kv_cache_dtype"] == "fp8"
    assert cli(parsed, "tp2-fp8", "prefill")["tensor_parallel_size"] == 2
    assert cli(parsed, "int8", "prefill")["kv_cache_dtype"] == "int8_per_token_head"
    assert cli(parsed, "nixl", "prefill")["kv_cache_dtype"] == "auto"


def test_user_engine_args_are_read_by_vllm(parsed: dict[str, Any]) -> None:
    got = cli(parsed, "user-args", "decode")
    assert (got["max_num_seqs"], got["enforce_eager"], got["dtype"], got["max_model_len"]) == (8, True, "float32", 2048)
    assert got["port"] == 8100


def test_vllm_reads_the_rendered_env(parsed: dict[str, Any]) -> None:
    for case in SPECS:
        for pool in ("prefill", "decode"):
            env = parsed[f"{case}/{pool}"]["env"]
            assert env["unknown"] == [], f"{case} {pool}: vLLM has no such env var"
            assert env["values"]["VLLM_HOST_IP"] == POD_IP and env["get_ip"] == POD_IP
    nixl = parsed["nixl-cpu-tcp/decode"]["env"]["values"]
    assert (nixl["VLLM_NIXL_SIDE_CHANNEL_HOST"], nixl["VLLM_NIXL_SIDE_CHANNEL_PORT"]) == (POD_IP, 5700)
    assert parsed["nixl/prefill"]["env"]["values"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] == 5600
    assert parsed["mooncake/prefill"]["env"]["values"]["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == 9000
    assert "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in parsed["mooncake/decode"]["env"]["values"]


@pytest.mark.parametrize("name", list(BAD_COMMANDS))
def test_vllms_parser_rejects_a_bad_command(parsed: dict[str, Any], name: str) -> None:
    result = parsed[f"bad/{name}"]["cli"]
    assert not result["ok"] and result["error"], result
