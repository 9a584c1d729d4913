"""Fleet step: P:D ratio band, GPU budget, their precedence, and decide_fleet end to end."""

from __future__ import annotations

from pdfleet.autoscale.config import FleetPolicyConfig, PoolPolicyConfig
from pdfleet.autoscale.fleet_decision import apply_fleet_constraints, decide_fleet
from pdfleet.autoscale.policy import Decision, PoolScalerState
from pdfleet.autoscale.signals import NO_SAMPLES, MetricsUnavailable, PoolSignals

NOW = 5_000.0


def fleet(gpu_budget=None, ratio=(None, None), prefill=None, decode=None) -> FleetPolicyConfig:
    pool = dict(min_replicas=1, max_replicas=16, scale_down_stabilization_s=0, max_scale_down_step=0)
    return FleetPolicyConfig(
        prefill=PoolPolicyConfig("prefill", **{**pool, **(prefill or {})}),
        decode=PoolPolicyConfig("decode", target_latency_ms=50, **{**pool, **(decode or {})}),
        gpu_budget=gpu_budget,
        pd_ratio_min=ratio[0],
        pd_ratio_max=ratio[1],
    )


def wants(pool: str, current: int, desired: int, pressure: float = 1.0, held: bool = False) -> Decision:
    return Decision(pool, current, desired, None if held else "latency", "test", {}, pressure=pressure, held=held)


def constrain(config, prefill: Decision, decode: Decision) -> tuple[int, int, dict[str, Decision]]:
    result = apply_fleet_constraints(config, {"prefill": prefill, "decode": decode})
    return result["prefill"].desired, result["decode"].desired, result


def test_no_fleet_settings_change_nothing():
    p, d, _ = constrain(fleet(), wants("prefill", 2, 9), wants("decode", 2, 1))
    assert (p, d) == (9, 1)


def test_ratio_band_raises_the_under_represented_pool():
    p, d, result = constrain(fleet(ratio=(0.25, 4)), wants("prefill", 2, 8), wants("decode", 1, 1))
    assert (p, d) == (8, 2)
    assert result["decode"].notes == ("P:D ratio band [0.25, 4] raises decode to 2",)
    assert result["decode"].reason == "decode 1\u21922: test; P:D ratio band [0.25, 4] raises decode to 2"


def test_ratio_band_raises_prefill_when_decode_outgrows_it():
    p, d, _ = constrain(fleet(ratio=(0.5, 2)), wants("prefill", 1, 1), wants("decode", 4, 6))
    assert (p, d) == (3, 6)


def test_ratio_band_lowers_when_the_other_pool_is_at_its_max():
    config = fleet(ratio=(0.5, 2), decode={"max_replicas": 3})
    p, d, _ = constrain(config, wants("prefill", 4, 10), wants("decode", 3, 3))
    assert (p, d) == (6, 3)


def test_budget_is_shared_in_proportion_to_the_asks():
    p, d, result = constrain(fleet(gpu_budget=8), wants("prefill", 2, 6, pressure=3.0), wants("decode", 2, 4, 1.5))
    assert (p, d) == (5, 3)  # 6:4 asked, 8 GPUs: 4.8:3.2, the rounding replica to the smaller share
    assert result["prefill"].notes == ("GPU budget 8 trims prefill to 5",)
    assert result["decode"].notes == ("GPU budget 8 trims decode to 3",)


def test_budget_keeps_a_split_within_one_replica_of_its_share():
    config = fleet(gpu_budget=8)
    # the share is 5:3; moving one replica from decode to prefill would only chase the rounding
    assert constrain(config, wants("prefill", 4, 6, pressure=3.0), wants("decode", 4, 4, 1.5))[:2] == (4, 4)
    # two replicas off is a real imbalance: move
    assert constrain(config, wants("prefill", 2, 6, pressure=3.0), wants("decode", 6, 4, 1.5))[:2] == (5, 3)


def test_budget_keeps_the_calmer_pool_alive():
    # winner-takes-all would trim decode to its floor; a starved pool comes back with the higher pressure next time
    p, d, _ = constrain(fleet(gpu_budget=9), wants("prefill", 8, 12, pressure=1.5), wants("decode", 1, 6, 1.2))
    assert (p, d) == (6, 3)


def test_budget_ties_go_to_the_higher_pressure_then_decode():
    config = fleet(gpu_budget=7)
    assert constrain(config, wants("prefill", 4, 4, pressure=2.0), wants("decode", 4, 4, 1.0))[:2] == (4, 3)
    assert constrain(config, wants("prefill", 4, 4, pressure=2.0), wants("decode", 4, 4, 2.0))[:2] == (3, 4)


def test_budget_counts_gpus_per_replica():
    config = fleet(gpu_budget=10, prefill={"gpus_per_replica": 2})
    p, d, _ = constrain(config, wants("prefill", 2, 4, pressure=1.0), wants("decode", 2, 4, pressure=2.0))
    assert (p, d) == (3, 4)  # 3 * 2 + 4 * 1 = 10


def test_budget_beats_the_ratio_band_and_keeps_its_proportions():
    config = fleet(gpu_budget=8, ratio=(0.5, 1))
    p, d, result = constrain(config, wants("prefill", 4, 8, pressure=3.0), wants("decode", 4, 4, pressure=1.5))
    # the band first raises decode to 8 (16 GPUs); the budget shares 8 as 4:4, which the band keeps
    assert (p, d) == (4, 4)
    assert result["decode"].notes == ("P:D ratio band [0.5, 1] raises decode to 8", "GPU budget 8 trims decode to 4")


def test_budget_wins_over_an_unreachable_ratio_and_says_so():
    config = fleet(gpu_budget=5, ratio=(1, 1), decode={"min_replicas": 3})
    p, d, result = constrain(config, wants("prefill", 3, 3, pressure=1.0), wants("decode", 3, 3, pressure=1.0))
    assert (p, d) == (2, 3)
    assert "P:D ratio band [1, 1] unreachable within bounds and budget" in result["prefill"].notes


def test_bounds_beat_the_budget():
    config = fleet(gpu_budget=6, prefill={"min_replicas": 4}, decode={"min_replicas": 4})
    p, d, result = constrain(config, wants("prefill", 4, 5), wants("decode", 4, 5))
    assert (p, d) == (4, 4)
    assert "GPU budget 6 exceeded at the pools' floors" in result["decode"].notes


def test_held_pool_is_not_moved_by_the_fleet_step():
    config = fleet(ratio=(0.5, 2))
    p, d, _ = constrain(config, wants("prefill", 4, 10), wants("decode", 2, 2, held=True))
    assert (p, d) == (4, 2)


def _signals(pool: str, replicas: int, **values) -> PoolSignals:
    base = dict(
        pool=pool,
        ttft_p=None,
        itl_p=None,
        queue_total=0.0,
        running_total=0.0,
        kv_usage=0.0,
        prompt_tps=0.0,
        gen_tps=0.0,
        request_rate=0.0,
        replicas_reporting=replicas,
        fetched_at=NOW,
    )
    return PoolSignals(**{**base, **values})


def test_decide_fleet_combines_pool_decisions_and_states():
    config = fleet(gpu_budget=5)
    readings = {"prefill": _signals("prefill", 2, queue_total=16.0), "decode": _signals("decode", 2, itl_p=0.075)}
    result = decide_fleet(config, {"prefill": 2, "decode": 2}, readings, {}, NOW)
    # prefill asks 3 (queue 8/replica, pressure 2.0), decode asks 3 (pressure 1.5): budget 5 is shared 3:2
    assert result.replicas == {"prefill": 3, "decode": 2}
    assert result.states["prefill"].last_scale_at == NOW
    assert result.states["decode"].last_scale_at is None
    assert result.decisions["decode"].reason == (
        "decode 2\u21922: ITL p90 75 ms > 50 ms; GPU budget 5 trims decode to 2"
    )


def test_decide_fleet_holds_a_pool_without_metrics():
    readings = {
        "prefill": _signals("prefill", 2, queue_total=16.0),
        "decode": MetricsUnavailable("decode", NO_SAMPLES, "nothing scraped"),
    }
    states = {"decode": PoolScalerState(last_scale_at=NOW - 60)}
    result = decide_fleet(fleet(), {"prefill": 2, "decode": 3}, readings, states, NOW)
    assert result.replicas == {"prefill": 3, "decode": 3}  # 16 waiting on 2: one breach adds at most 1.5x
    assert result.decisions["decode"].held
    assert result.states["decode"].last_scale_at == NOW - 60
