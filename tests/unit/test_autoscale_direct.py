"""A prefill pool at zero: the decodes serve requests whole (the router's direct path) while they can compute the
prompts within the SLA, and prefill replicas come back when they cannot (`direct_serving_estimate`)."""

from __future__ import annotations

import pytest

from pdfleet.autoscale.config import FleetPolicyConfig, PoolPolicyConfig
from pdfleet.autoscale.fleet_decision import decide_fleet
from pdfleet.autoscale.policy import (
    DIRECT_SERVING_MAX_SHARE,
    DIRECT_SERVING_RETURN_SHARE,
    PoolScalerState,
    Recommendation,
)
from pdfleet.autoscale.signals import NO_SAMPLES, MetricsUnavailable, PoolSignals, TokenHistogram
from pdfleet.perfmodel.replica import prefill_throughput, replica_model

NOW = 10_000.0
REPLICA = replica_model("meta-llama/Llama-3.1-8B-Instruct", "NVIDIA-H100-80GB-HBM3", 1)
PROMPT = 1_000  # computed tokens per request
RATE = 4.0  # requests/s
THROUGHPUT = prefill_throughput(REPLICA, PROMPT)  # one replica's back-to-back prompt tokens/s


def histogram(tokens: float) -> TokenHistogram:
    """Every request of the window computed `tokens` prompt tokens."""
    return TokenHistogram(((tokens, RATE), (float("inf"), RATE)))


def pool_config(pool: str, **overrides) -> PoolPolicyConfig:
    base = dict(
        pool=pool,
        min_replicas=0 if pool == "prefill" else 1,
        max_replicas=8,
        target_latency_ms=500 if pool == "prefill" else 50,
        scale_down_stabilization_s=0,
        max_scale_down_step=0,
        replica_model=REPLICA,
    )
    return PoolPolicyConfig(**{**base, **overrides})


def fleet(prefill: dict | None = None) -> FleetPolicyConfig:
    return FleetPolicyConfig(prefill=pool_config("prefill", **(prefill or {})), decode=pool_config("decode"))


def signals(pool: str, replicas: int, computed_tps: float | None, **values) -> PoolSignals:
    """A pool serving RATE req/s of PROMPT-token prompts, computing `computed_tps` prompt tokens/s of them."""
    base = dict(
        pool=pool,
        ttft_p=0.1,
        itl_p=0.02,
        queue_total=0.0,
        running_total=4.0,
        kv_usage=0.2,
        prompt_tps=RATE * PROMPT,
        gen_tps=RATE * 200,
        request_rate=RATE,
        replicas_reporting=replicas,
        fetched_at=NOW,
        computed_tps=computed_tps,
        prefill_tokens=histogram(PROMPT if pool == "prefill" or computed_tps else 0),
    )
    return PoolSignals(**{**base, **values})


def with_prefill(share: float, **decode_values) -> dict:
    """One prefill replica computing prompts worth `share` of two decodes' prefill throughput."""
    work = share * 2 * THROUGHPUT
    return {
        "prefill": signals("prefill", 1, work, request_rate=work / PROMPT),
        "decode": signals("decode", 2, 0.0, **decode_values),
    }


def at_zero(share: float, **decode_values) -> dict:
    """No prefill replica: the two decodes compute prompts worth `share` of their prefill throughput."""
    work = share * 2 * THROUGHPUT
    return {
        "prefill": MetricsUnavailable("prefill", NO_SAMPLES, "no prefill replica reported engine metrics"),
        "decode": signals("decode", 2, work, request_rate=work / PROMPT, **decode_values),
    }


def decide(config: FleetPolicyConfig, prefill: int, readings: dict, states: dict | None = None):
    return decide_fleet(config, {"prefill": prefill, "decode": 2}, readings, states or {}, NOW)


def test_light_prompts_take_the_prefill_pool_to_zero():
    result = decide(fleet(), 1, with_prefill(0.1))
    decision = result.decisions["prefill"]
    assert (decision.desired, decision.driving_signal) == (0, "direct")
    assert "of 2 decode replicas' prefill throughput: the decode pool serves them" in decision.reason
    assert decision.signals["direct_serving_share"] == pytest.approx(0.1, rel=0.05)


def test_min_replicas_1_keeps_a_prefill_replica():
    result = decide(fleet({"min_replicas": 1}), 1, with_prefill(0.1))
    assert result.decisions["prefill"].desired == 1
    assert result.decisions["prefill"].driving_signal != "direct"


def test_prompts_over_the_share_keep_the_prefill_pool():
    result = decide(fleet(), 1, with_prefill(DIRECT_SERVING_MAX_SHARE + 0.05))
    assert result.decisions["prefill"].desired >= 1
    assert result.decisions["prefill"].driving_signal != "direct"


def test_a_decode_itl_the_prompts_would_push_past_target_keeps_the_prefill_pool():
    # 40 ms now; prompts at 20 % of the decodes' time make it 50 ms: over 50 ms x (1 - 10 %)
    result = decide(fleet(), 1, with_prefill(0.2, itl_p=0.04))
    assert result.decisions["prefill"].driving_signal != "direct"
    assert decide(fleet(), 1, with_prefill(0.2, itl_p=0.02)).decisions["prefill"].desired == 0


def test_going_to_zero_waits_for_the_scale_down_window():
    config = fleet({"scale_down_stabilization_s": 300})
    recent = {"prefill": PoolScalerState(recommendations=(Recommendation(NOW - 100, 1),))}
    assert decide(config, 1, with_prefill(0.1), recent).decisions["prefill"].desired == 1
    settled = {"prefill": PoolScalerState(recommendations=(Recommendation(NOW - 400, 1),))}
    assert decide(config, 1, with_prefill(0.1), settled).decisions["prefill"].desired == 0


def test_at_zero_the_pool_stays_while_the_prompts_fit_under_the_return_share():
    share = (DIRECT_SERVING_MAX_SHARE + DIRECT_SERVING_RETURN_SHARE) / 2  # too much to go to zero, not to come back
    result = decide(fleet(), 0, at_zero(share))
    assert (result.decisions["prefill"].desired, result.decisions["prefill"].driving_signal) == (0, "direct")


def test_at_zero_prompts_over_the_return_share_bring_prefill_replicas_back():
    result = decide(fleet(), 0, at_zero(DIRECT_SERVING_RETURN_SHARE + 0.2))
    decision = result.decisions["prefill"]
    assert decision.desired >= 1
    assert decision.reason.endswith("): prefill replicas again")


def test_at_zero_a_measured_latency_over_target_brings_prefill_replicas_back():
    ttft = decide(fleet(), 0, at_zero(0.1, ttft_p=0.6)).decisions["prefill"]
    assert ttft.desired >= 1 and "TTFT p90 600 ms" in ttft.reason
    # decode not autoscaled: prefill replicas are what can take the prompts' share off its steps
    fixed_decode = FleetPolicyConfig(prefill=pool_config("prefill"), decode=pool_config("decode", enabled=False))
    itl = decide(fixed_decode, 0, at_zero(0.1, itl_p=0.055)).decisions["prefill"]
    assert itl.desired >= 1 and "ITL p90 55 ms" in itl.reason
    # under the target itself (hysteresis: going to zero needed 10 % below it) the pool stays at zero
    assert decide(fixed_decode, 0, at_zero(0.1, itl_p=0.047)).decisions["prefill"].desired == 0


def test_at_zero_an_autoscaled_decode_pool_answers_its_own_itl_breach():
    result = decide(fleet(), 0, at_zero(0.1, itl_p=0.08))
    assert result.decisions["prefill"].desired == 0
    assert result.decisions["decode"].desired > 2


def test_at_zero_decodes_without_the_prompt_histogram_bring_one_prefill_replica_back():
    readings = at_zero(0.1)
    readings["decode"] = signals("decode", 2, None, prefill_tokens=None)
    decision = decide(fleet(), 0, readings).decisions["prefill"]
    assert decision.desired == 1
    assert "no decode reading of vllm:request_prefill_kv_computed_tokens: prefill replicas again" in decision.reason


def test_at_zero_without_a_timing_model_traffic_brings_one_prefill_replica_back_and_idleness_does_not():
    config = FleetPolicyConfig(prefill=pool_config("prefill"), decode=pool_config("decode", replica_model=None))
    back = decide(config, 0, at_zero(0.1)).decisions["prefill"]
    assert back.desired == 1 and "no timing model of the decode replicas" in back.reason
    idle = decide(config, 0, at_zero(0.0)).decisions["prefill"]  # no prompts: no requests
    assert idle.desired == 0


def test_at_zero_without_decode_metrics_the_pool_holds():
    readings = {
        "prefill": MetricsUnavailable("prefill", NO_SAMPLES, "no prefill replica"),
        "decode": MetricsUnavailable("decode", NO_SAMPLES, "nothing scraped"),
    }
    result = decide(fleet(), 0, readings)
    assert result.decisions["prefill"].desired == 0 and result.decisions["prefill"].held


def test_at_zero_the_prefill_pools_ttft_is_the_decodes():
    decision = decide(fleet(), 0, at_zero(0.1, ttft_p=0.2)).decisions["prefill"]
    assert decision.signals["ttft_p90_ms"] == pytest.approx(200.0)
