"""`pdfleet engine serve` argument parsing, KV block ledger and fault switches."""

import json

import pytest

from pdfleet.engine.config import parse_serve_args
from pdfleet.engine.faults import Faults
from pdfleet.engine.kvcache import KvBlockPool


def kv(role: str) -> list[str]:
    return ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": role})]


def test_vllm_args_and_role_from_kv_role(monkeypatch):
    monkeypatch.delenv("PDFLEET_EMULATOR_MODEL", raising=False)
    monkeypatch.delenv("POD_IP", raising=False)
    monkeypatch.delenv("PDFLEET_ADVERTISE_HOST", raising=False)
    s = parse_serve_args(
        [
            "meta-llama/Llama-3.1-70B-Instruct",
            "--port",
            "9000",
            "--served-model-name",
            "llama-70b",
            *kv("kv_producer"),
            "--kv-cache-dtype",
            "fp8",
            "--max-num-seqs",
            "64",
            "--tensor-parallel-size",
            "4",
            "--dtype",
            "bfloat16",
            "--enable-prefix-caching",
        ]
    )
    assert (s.role, s.port, s.served_model_name, s.kv_connector) == ("prefill", 9000, "llama-70b", "NixlConnector")
    assert (s.kv_cache_dtype, s.max_num_seqs, s.tensor_parallel_size) == ("fp8", 64, 4)
    assert s.model_preset == "llama-3.1-70b"  # guessed from the HF model id
    assert s.ignored_args == ["--dtype", "bfloat16", "--enable-prefix-caching"]
    assert s.advertise_host == "127.0.0.1"  # bind host 0.0.0.0 is not routable
    assert parse_serve_args(["m", *kv("kv_consumer")]).role == "decode"
    assert parse_serve_args(["m", *kv("kv_both")]).role == "both"
    assert parse_serve_args(["--model", "m"]).role == "both"


def test_emulator_args_and_env_defaults(monkeypatch):
    monkeypatch.setenv("PDFLEET_EMULATOR_MODEL", "qwen2.5-0.5b")
    monkeypatch.setenv("PDFLEET_EMULATOR_GPU", "NVIDIA-L4")
    monkeypatch.setenv("PDFLEET_RACK", "rack-b")
    monkeypatch.setenv("POD_IP", "10.0.0.7")
    s = parse_serve_args(
        [
            "meta-llama/Llama-3.1-8B",
            "--emulator-zero-delay",
            "--fault-fail-kv-pull",
            "2",
            "--kv-load-failure-policy",
            "recompute",
        ]
    )
    assert (s.model_preset, s.gpu_preset, s.rack, s.advertise_host) == ("qwen2.5-0.5b", "L4", "rack-b", "10.0.0.7")
    assert s.zero_delay and s.faults.fail_kv_pull == 2 and s.kv_load_failure_policy == "recompute"
    s = parse_serve_args(["m", "--emulator-speedup", "20", "--rack", "r1", "--emulator-advertise-host", "h"])
    assert (s.speedup, s.rack, s.advertise_host) == (20.0, "r1", "h")


def test_kv_lease_from_kv_connector_extra_config():
    assert parse_serve_args(["m", *kv("kv_producer")]).kv_hold_ttl_s == 30.0  # vLLM 0.32's kv_lease_duration
    lease = json.dumps(
        {
            "kv_connector": "NixlConnector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"kv_lease_duration": 7},
        }
    )
    s = parse_serve_args(["m", "--kv-transfer-config", lease])
    assert s.kv_hold_ttl_s == 7.0 and s.kv_connector_extra_config == {"kv_lease_duration": 7} and s.nixl
    assert parse_serve_args(["m", "--kv-transfer-config", lease, "--emulator-kv-ttl", "2"]).kv_hold_ttl_s == 2
    assert not parse_serve_args(["m"]).nixl


@pytest.mark.parametrize(
    "argv",
    [
        [],
        [
            "m",
            "--kv-transfer-config",
            '{"kv_role": "kv_producer", "kv_connector_extra_config": {"kv_lease_duration": 0}}',
        ],
        ["m", "--emulator-gpu", "TPU"],
        ["m", "--emulator-speedup", "0"],
        ["m", "--emulator-speedup", "2", "--emulator-zero-delay"],
        ["m", "--kv-transfer-config", '{"kv_role": "kv_sideways"}'],
        ["m", "--fault-slowdown", "-1"],
    ],
)
def test_bad_arguments_exit(argv):
    with pytest.raises(SystemExit):
        parse_serve_args(argv)


def test_kv_pool_allocation_holds_and_expiry():
    pool = KvBlockPool(capacity_blocks=10, block_size=16)
    assert pool.try_allocate(8) and not pool.try_allocate(3) and pool.usage == 0.8
    pool.free(8)
    expired = []
    pool = KvBlockPool(capacity_blocks=10, block_size=16, on_expire=expired.append)
    # as vLLM 0.32's NIXL producer: every block the prompt occupies, the partial last one included
    assert pool.hold("short", 15, now=0.0, ttl_s=5) == [1]
    ids = pool.hold("r1", 40, now=0.0, ttl_s=5)
    assert ids == [2, 3, 4] and pool.used_blocks == 4 and pool.held_requests == 2
    assert pool.take("r1", [2, 3]) is None  # wrong ids
    held = pool.take("r1", ids)
    assert held is not None and held.num_tokens == 40 and pool.used_blocks == 1
    assert pool.take("r1", ids) is None  # already taken ...
    assert pool.released("r1", ids) == held and pool.released("r1", [2]) is None  # ... but remembered
    assert pool.expire(5.0) == 1 and expired == [1] and pool.released("short", [1]) is not None
    pool.hold("r2", 16, now=0.0, ttl_s=5)
    pool.hold("r3", 16, now=1.0, ttl_s=5)
    assert pool.expire(5.5) == 1 and pool.held_requests == 1 and pool.used_blocks == 1 and expired == [1, 1]
    assert pool.released("never", [1]) is None


def test_faults_update_and_consume():
    faults = Faults()
    faults.update({"fail_kv_source": 2, "slowdown": 3, "hang": True})
    assert faults.slowdown == 3.0 and faults.hang
    assert faults.take_kv_source_failure() and faults.take_kv_source_failure()
    assert not faults.take_kv_source_failure()
    for bad in ({"nope": 1}, {"hang": 1}, {"fail_kv_pull": -1}, {"slowdown": 0}):
        with pytest.raises(ValueError):
            faults.update(bad)
    faults.update({"crash_after_tokens": None})
    assert faults.as_dict()["crash_after_tokens"] is None


def test_kv_pool_reused_request_id_replaces_the_old_hold():
    pool = KvBlockPool(capacity_blocks=10, block_size=16)
    pool.hold("same", 32, now=0.0, ttl_s=5)
    ids = pool.hold("same", 16, now=1.0, ttl_s=5)
    assert pool.used_blocks == 1 and pool.held_requests == 1 and pool.take("same", ids) is not None
