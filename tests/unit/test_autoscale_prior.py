"""The capacity prior: the timing model's per-replica capacity at the SLA, used before a pool first saturates."""

from __future__ import annotations

import pytest

from pdfleet.api.model import PDDeploymentSpec
from pdfleet.autoscale.config import PoolPolicyConfig, policy_config_from_spec
from pdfleet.autoscale.policy import LEARNED_CAPACITY_UTILIZATION, PoolScalerState, decide_pool, prior_capacity
from pdfleet.autoscale.signals import PoolSignals
from pdfleet.perfmodel.replica import (
    DECODE_UTILIZATION,
    PREFILL_UTILIZATION,
    decode_capacity,
    decode_sla_capacity,
    prefill_sla_capacity,
    prefill_throughput,
    replica_model,
)

NOW = 1_000.0
REPLICA = replica_model("meta-llama/Llama-3.1-8B-Instruct", "NVIDIA-H100-80GB-HBM3", 1)


def reading(pool: str = "prefill", **values) -> PoolSignals:
    """An unsaturated pool of 2 replicas serving 10 req/s of 1,000-token prompts and 200-token outputs."""
    base = dict(
        pool=pool,
        ttft_p=0.1,
        itl_p=0.01,
        queue_total=0.0,
        running_total=4.0,
        kv_usage=0.1,
        prompt_tps=10_000.0,
        gen_tps=2_000.0,
        request_rate=10.0,
        replicas_reporting=2,
        fetched_at=NOW,
    )
    base.update(values)
    return PoolSignals(**base)


def config(pool: str = "prefill", **overrides) -> PoolPolicyConfig:
    """No stabilization or step limits, so each test sees only the capacity signal."""
    base = dict(
        pool=pool,
        max_replicas=64,
        target_latency_ms=500 if pool == "prefill" else 50,
        scale_down_stabilization_s=0,
        max_scale_up_step=0,
        max_scale_down_step=0,
        replica_model=REPLICA,
    )
    base.update(overrides)
    return PoolPolicyConfig(**base)


def spec(gpu_product: str | None, model: str = "meta-llama/Llama-3.1-70B-Instruct", **pool) -> PDDeploymentSpec:
    settings = {"gpusPerReplica": 4, "gpuProduct": gpu_product, **pool}
    return PDDeploymentSpec.model_validate(
        {"model": {"name": model}, "prefill": settings, "decode": settings, "engine": {"args": ["--max-num-seqs=64"]}}
    )


def test_prior_is_the_derated_timing_model_capacity():
    assert REPLICA is not None
    assert prefill_sla_capacity(REPLICA, 1000) == pytest.approx(prefill_throughput(REPLICA, 1000) * PREFILL_UTILIZATION)
    assert decode_sla_capacity(REPLICA, 50, 1000, 200) == pytest.approx(
        decode_capacity(REPLICA, 0.05, 1100) * DECODE_UTILIZATION
    )


def test_prior_uses_the_readings_mean_lengths():
    assert prior_capacity(config(), reading()) == pytest.approx(prefill_sla_capacity(REPLICA, 1000))
    assert prior_capacity(config("decode"), reading("decode")) == pytest.approx(
        decode_sla_capacity(REPLICA, 50, 1000, 200)
    )


def test_prior_sizes_the_pool_before_any_learning():
    capacity = prefill_sla_capacity(REPLICA, 1000)
    demand = 20 * capacity  # far past two replicas, latency still under target (the ramp before saturation)
    busy = reading(prompt_tps=demand, request_rate=demand / 1000)
    decision, state = decide_pool(config(), 2, busy, PoolScalerState(), NOW)
    assert decision.driving_signal == "capacity"
    assert decision.desired == 20
    assert decision.signals["capacity_tps_per_replica"] == pytest.approx(capacity)
    assert state.learned_capacity_tps is None  # the prior is not remembered as learned


def test_no_prior_without_request_rate():
    assert prior_capacity(config(), reading(request_rate=0.0)) is None
    assert prior_capacity(config(), reading(request_rate=None)) is None


def test_learned_capacity_replaces_the_prior():
    # busy enough (34 % of the modelled throughput) for a TTFT over target to be queueing, not the prompts' own tail
    saturated = reading(ttft_p=0.6, prompt_tps=20_000.0, request_rate=20.0)
    decision, state = decide_pool(config(), 2, saturated, PoolScalerState(), NOW)
    learned = 20_000.0 / 2 * LEARNED_CAPACITY_UTILIZATION
    assert state.learned_capacity_tps == pytest.approx(learned)
    assert decision.signals["capacity_tps_per_replica"] == pytest.approx(learned)
    # a lighter load teaches nothing (a heavier one with latency headroom would raise it: test_autoscale_floor)
    later, _ = decide_pool(config(), 2, reading(prompt_tps=2_000.0, request_rate=2.0), state, NOW + 15)
    assert later.signals["capacity_tps_per_replica"] == pytest.approx(learned)


def test_configured_capacity_wins_and_is_not_learned_over():
    saturated = reading(ttft_p=0.6)
    decision, state = decide_pool(config(capacity_tokens_per_s=3_000.0), 2, saturated, PoolScalerState(), NOW)
    assert decision.signals["capacity_tps_per_replica"] == 3_000.0
    assert state.learned_capacity_tps is None


def test_spec_with_known_gpu_and_model_gets_a_replica_model():
    pool = policy_config_from_spec(spec("NVIDIA-H100-80GB-HBM3")).decode
    assert pool.replica_model is not None
    assert pool.replica_model.hardware.tp == 4
    assert pool.replica_model.max_num_seqs == 64  # from engine.args


@pytest.mark.parametrize(
    "gpu_product,model",
    [
        (None, "meta-llama/Llama-3.1-70B-Instruct"),
        ("NVIDIA-B200", "meta-llama/Llama-3.1-70B-Instruct"),
        ("NVIDIA-H100-80GB-HBM3", "mistralai/Mixtral-8x7B-v0.1"),
    ],
)
def test_unknown_gpu_or_model_means_no_prior(gpu_product, model):
    fleet = policy_config_from_spec(spec(gpu_product, model))
    assert fleet.prefill.replica_model is None
    assert prior_capacity(fleet.prefill, reading()) is None


def test_model_that_does_not_fit_means_no_prior():
    assert replica_model("llama-3.1-70b", "L4", 1) is None
