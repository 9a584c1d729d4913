"""The performance model of a fleet's pools: built once per distinct spec, not on every autoscaler interval."""

from __future__ import annotations

import pytest

from pdfleet.perfmodel import replica as replica_module
from pdfleet.perfmodel.replica import pool_replica_model
from pdfleet.perfmodel.vllm_args import BATCH_LIMIT_DEFAULTS, vllm_batch_limits
from pdfleet.testing.builders import H100, minimal_spec


def test_a_pools_model_parses_the_engine_args_once_per_spec(monkeypatch: pytest.MonkeyPatch):
    parses: list[list[str]] = []

    def counting(args: list[str]) -> dict:
        parses.append(args)
        return vllm_batch_limits(args)

    monkeypatch.setattr(replica_module, "vllm_batch_limits", counting)
    replica_module._engine_replica_model.cache_clear()
    spec = minimal_spec(engine={"kind": "vllm", "args": ["--max-num-seqs", "64"]}, decode={"gpuProduct": H100})
    models = [pool_replica_model(spec, "decode") for _ in range(10)]  # ten autoscaler intervals
    assert len(parses) == 1 and models[0] is not None and all(m is models[0] for m in models)
    assert models[0].max_num_seqs == 64
    changed = minimal_spec(engine={"kind": "vllm", "args": ["--max-num-seqs", "32"]}, decode={"gpuProduct": H100})
    assert pool_replica_model(changed, "decode").max_num_seqs == 32
    assert len(parses) == 2


def test_batch_limits_read_vllm_flags_with_vllm_defaults_and_ignore_malformed_values():
    assert vllm_batch_limits([]) == BATCH_LIMIT_DEFAULTS
    assert vllm_batch_limits(["--max-num-seqs", "8", "--enforce-eager"])["max_num_seqs"] == 8
    assert vllm_batch_limits(["--max-num-seqs", "eight"]) == BATCH_LIMIT_DEFAULTS
