"""Policy wiring: API defaults reach the operator's policy, baselines size as documented, planner arithmetic."""

from __future__ import annotations

import math

import pytest

from pdfleet.sim.config import FleetConfig, fleet_from_options
from pdfleet.sim.planner import PlannerCorrections, PlannerObservation, corrections, plan_replicas
from pdfleet.sim.policies import POLICY_NAMES, build_policy, hpa_queue_config, pdfleet_config, planner_options
from pdfleet.sim.profile import decode_capacity, prefill_throughput, prefill_ttft, sla_capacity, static_sizes
from pdfleet.sim.trace import TraceRequest

FLEET = FleetConfig()


def test_pdfleet_config_uses_api_defaults_and_overrides() -> None:
    config = pdfleet_config(FLEET)
    assert (config.interval_s, config.window_s, config.percentile) == (15, 60, 90)
    assert config.prefill.target_latency_ms == FLEET.ttft_ms and config.decode.target_latency_ms == FLEET.tpot_ms
    assert config.prefill.max_replicas == FLEET.max_replicas and config.prefill.gpus_per_replica == 4
    tuned = pdfleet_config(
        FLEET,
        {
            "prefill.targetLatencyMs": 300,
            "maxScaleUpStep": 2,
            "autoscaler.intervalSeconds": 10,
            "prefill.capacityTokensPerSecond": 1000.0,
        },
    )
    assert tuned.prefill.target_latency_ms == 300 and tuned.decode.target_latency_ms == FLEET.tpot_ms
    assert tuned.prefill.max_scale_up_step == tuned.decode.max_scale_up_step == 2
    assert tuned.interval_s == 10 and tuned.prefill.capacity_tokens_per_s == 1000.0
    assert tuned.decode.capacity_tokens_per_s is None
    with pytest.raises(ValueError):
        pdfleet_config(FLEET, tuning={"router.locality": "any"})


def test_hpa_queue_keeps_only_the_queue_signal() -> None:
    config = hpa_queue_config(FLEET)
    for pool in (config.prefill, config.decode):
        assert pool.target_latency_ms == 0 and pool.capacity_tokens_per_s is None
        assert pool.target_queue_per_replica == 4 and pool.max_scale_up_step == 4
        assert pool.plain_hpa  # plain HPA: an empty queue shrinks the pool


def test_seed_capacity_sets_the_api_field_from_the_profile() -> None:
    trace = [TraceRequest(float(i), 1000, 100) for i in range(120)]
    profiled = sla_capacity(FLEET, 1000, 100)
    policy, _ = build_policy("pdfleet-seeded", FLEET, trace, {"seedCapacity": True})
    assert policy.config.prefill.capacity_tokens_per_s == pytest.approx(profiled["prefill"])
    assert policy.config.decode.capacity_tokens_per_s == pytest.approx(profiled["decode"])
    explicit, _ = build_policy("pdfleet-x", FLEET, trace, {"seedCapacity": True, "decode.capacityTokensPerSecond": 7})
    assert explicit.config.decode.capacity_tokens_per_s == 7


def test_every_named_policy_builds() -> None:
    trace = [TraceRequest(float(i), 1000, 100) for i in range(120)]
    for name in POLICY_NAMES:
        policy, fleet = build_policy(name, FLEET, trace)
        assert policy.name == name
        assert fleet.disaggregated == (name != "colocated")
    with pytest.raises(ValueError):
        build_policy("magic", FLEET, trace)


def test_static_sizes_follow_peak_mean_and_first_minute_demand() -> None:
    # 60 s at 1 req/s, then 60 s at 10 req/s, all 1000-token prompts and 100-token answers
    trace = [TraceRequest(i * 1.0, 1000, 100) for i in range(60)] + [
        TraceRequest(60 + i * 0.1, 1000, 100) for i in range(600)
    ]
    capacity = sla_capacity(FLEET, 1000, 100)
    sizes = static_sizes(FLEET, trace)
    assert sizes["peak"]["prefill"] == math.ceil(10_000 / capacity["prefill"])
    assert sizes["mean"]["prefill"] == math.ceil(660 * 1000 / trace[-1].arrival / capacity["prefill"])
    assert sizes["peak"]["prefill"] >= sizes["mean"]["prefill"]
    assert sizes["first"]["prefill"] == math.ceil(1000 / capacity["prefill"])  # where the autoscalers start


def test_profile_is_monotone() -> None:
    assert prefill_ttft(FLEET, 4000) > prefill_ttft(FLEET, 1000)
    assert prefill_throughput(FLEET, 1000) > 0
    assert decode_capacity(FLEET, 0.05, 1000) > decode_capacity(FLEET, 0.02, 1000)
    assert decode_capacity(FLEET, 0.05, 1000) > decode_capacity(FLEET, 0.05, 8000)


def test_planner_sizes_from_profiled_throughput() -> None:
    obs = PlannerObservation(requests=1800, isl=1000, osl=200, ttft_s=0.0, itl_s=0.0, decode_batch=0)
    plan = plan_replicas(FLEET, obs, PlannerCorrections(1.0, 1.0), 180, 64)
    assert plan["prefill"] == math.ceil(10 * 1000 / prefill_throughput(FLEET, 1000))
    assert plan["decode"] == math.ceil(10 * 200 / decode_capacity(FLEET, 0.05, 1100))
    # prefill correction only ever lowers the estimate (min(1, factor)); decode correction tightens the ITL target
    slow = plan_replicas(FLEET, obs, PlannerCorrections(3.0, 2.0), 180, 64)
    fast = plan_replicas(FLEET, obs, PlannerCorrections(0.5, 1.0), 180, 64)
    assert slow["prefill"] == plan["prefill"] and fast["prefill"] <= plan["prefill"]
    assert slow["decode"] >= plan["decode"]


def test_planner_headroom_sizes_for_a_share_of_the_profile() -> None:
    obs = PlannerObservation(requests=1800, isl=1000, osl=200, ttft_s=0.0, itl_s=0.0, decode_batch=0)
    derated = plan_replicas(FLEET, obs, PlannerCorrections(1.0, 1.0), 180, 64, utilization=(0.5, 0.8))
    assert derated["prefill"] == math.ceil(10 * 1000 / (0.5 * prefill_throughput(FLEET, 1000)))
    assert derated["decode"] == math.ceil(10 * 200 / (0.8 * decode_capacity(FLEET, 0.05, 1100)))


def test_planner_variants_take_only_utilizations_in_range() -> None:
    assert planner_options({"prefillUtilization": 0.4}) == {"prefill_utilization": 0.4}
    with pytest.raises(ValueError, match="unknown planner options"):
        planner_options({"interval": 60})
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        planner_options({"decodeUtilization": 1.5})


def test_planner_corrections_compare_with_the_profile() -> None:
    obs = PlannerObservation(100, 1000, 200, ttft_s=2 * prefill_ttft(FLEET, 1000), itl_s=0.0, decode_batch=0)
    corr = corrections(FLEET, obs)
    assert corr.prefill == pytest.approx(2.0) and corr.decode == 1.0


def test_fleet_options_are_typed_and_checked() -> None:
    fleet = fleet_from_options(
        {"model": "llama-3.1-8b", "gpus_per_replica": "1", "disaggregated": "false", "startup_s": "45"}
    )
    assert (fleet.gpus_per_replica, fleet.disaggregated, fleet.startup_s) == (1, False, 45.0)
    with pytest.raises(ValueError):
        fleet_from_options({"colour": "red"})
    with pytest.raises(ValueError):
        fleet_from_options({"model": "llama-3.1-70b", "gpus_per_replica": "1"})  # 70B does not fit on one H100
