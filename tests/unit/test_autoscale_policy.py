"""Per-pool scaling policy: HPA formula per signal, tolerance, max over signals, capacity, stabilization, limits, and
the fixes the fleet simulator proved necessary (saturation signals only scale up, a latency breach is capped, capacity
is learned only while saturated)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from pdfleet.autoscale.config import PoolPolicyConfig
from pdfleet.autoscale.policy import (
    LATENCY_BREACH_MAX_GROWTH,
    LEARNED_CAPACITY_UTILIZATION,
    PoolScalerState,
    Recommendation,
    decide_pool,
    fresh_state,
    learn_capacity,
)
from pdfleet.autoscale.signals import NO_SAMPLES, MetricsUnavailable, PoolSignals

NOW = 10_000.0


def reading(pool: str = "prefill", **values) -> PoolSignals:
    """A PoolSignals of an idle-looking pool with 2 reporting replicas, overridden by `values`."""
    base = dict(
        pool=pool,
        ttft_p=None,
        itl_p=None,
        queue_total=0.0,
        running_total=0.0,
        kv_usage=0.1,
        prompt_tps=0.0,
        gen_tps=0.0,
        request_rate=0.0,
        replicas_reporting=2,
        fetched_at=NOW,
    )
    base.update(values)
    return PoolSignals(**base)


def prefill_config(**overrides) -> PoolPolicyConfig:
    """Prefill config with no stabilization or step limits unless overridden, so each test sees one mechanism."""
    base = dict(
        pool="prefill",
        min_replicas=1,
        max_replicas=16,
        target_latency_ms=500,
        target_queue_per_replica=4,
        tolerance=0.1,
        scale_up_stabilization_s=0,
        scale_down_stabilization_s=0,
        max_scale_up_step=0,
        max_scale_down_step=0,
    )
    base.update(overrides)
    return PoolPolicyConfig(**base)


def decode_config(**overrides) -> PoolPolicyConfig:
    return prefill_config(pool="decode", target_latency_ms=50, **overrides)


def sized_config(**overrides) -> PoolPolicyConfig:
    """Prefill config with a known capacity of 1000 prompt tokens/s per replica: the signal that may shrink a pool."""
    return prefill_config(capacity_tokens_per_s=1000, **overrides)


def decide(config, current, signals, state=PoolScalerState(), now=NOW):
    return decide_pool(config, current, signals, state, now, percentile=90, window_s=60)


def test_ttft_alone_scales_prefill_by_the_hpa_formula():
    decision, _ = decide(prefill_config(), 4, reading(ttft_p=0.7, replicas_reporting=4))
    assert decision.desired == 6  # ceil(4 * 700 / 500)
    assert decision.driving_signal == "latency"
    assert decision.reason == "prefill 4\u21926: TTFT p90 700 ms > 500 ms"
    assert decision.signals["ttft_p90_ms"] == pytest.approx(700)


def test_itl_alone_scales_decode():
    decision, _ = decide(decode_config(), 3, reading("decode", itl_p=0.07, replicas_reporting=3))
    assert (decision.desired, decision.driving_signal) == (5, "latency")
    assert decision.reason == "decode 3\u21925: ITL p90 70 ms > 50 ms"


def test_a_latency_breach_is_capped_relative_to_the_measured_size():
    # a queue formed: TTFT p90 is 20x target, which the HPA formula would turn into 80 replicas
    decision, _ = decide(prefill_config(target_queue_per_replica=0), 4, reading(ttft_p=10.0, replicas_reporting=4))
    assert decision.desired == 6 == math.ceil(4 * LATENCY_BREACH_MAX_GROWTH)
    assert decision.reason == "prefill 4\u21926: TTFT p90 10000 ms > 500 ms (one breach adds at most to 6)"


def test_the_breach_cap_follows_the_capacity_view():
    # the capacity reading calls for 10 replicas, so the breach may ask for up to 1.5 x 10
    decision, _ = decide(sized_config(), 4, reading(ttft_p=10.0, prompt_tps=10_000, replicas_reporting=4))
    assert (decision.desired, decision.driving_signal) == (15, "latency")


def test_prefill_is_sized_by_the_prompt_tokens_it_computes_not_those_its_cache_served():
    # 8,000 prompt tokens/s arrive, 6,000 of them prefix-cache hits: 2 replicas of 1,000 computed tokens/s, not 8
    hits, _ = decide(
        sized_config(),
        4,
        reading(prompt_tps=8_000, computed_tps=2_000, request_rate=4, ttft_p=0.1, replicas_reporting=4),
    )
    assert (hits.desired, hits.driving_signal) == (2, "capacity")
    assert hits.signals["prompt_tps"] == 8_000 and hits.signals["computed_tps"] == 2_000  # both reported
    # an engine without the computed-tokens series: every prompt token counts
    plain, _ = decide(sized_config(), 4, reading(prompt_tps=8_000, request_rate=4, ttft_p=0.1, replicas_reporting=4))
    assert plain.desired == 8
    # decode holds the whole prompt's KV whatever the prefill computed: its reading is left as it is
    config = decode_config(capacity_tokens_per_s=1_000)
    with_computed, _ = decide(config, 4, reading("decode", gen_tps=3_000, prompt_tps=9_000, computed_tps=1))
    without, _ = decide(config, 4, reading("decode", gen_tps=3_000, prompt_tps=9_000))
    assert with_computed.desired == without.desired and with_computed.cause == without.cause


def test_a_latency_breach_does_not_compound_while_replicas_start():
    # 9 asked for, 3 ready and queueing; the capacity view needs 5: nothing more until the others report
    config = prefill_config(capacity_tokens_per_s=10_000, target_queue_per_replica=0)
    decision, _ = decide(config, 9, reading(ttft_p=3.3, prompt_tps=45_000, replicas_reporting=3))
    assert decision.desired == 9


def test_a_breach_waits_for_starting_replicas_but_capacity_still_adds():
    # 3 asked for, 2 reporting, TTFT 4x: the breach was measured without the third, so nothing more yet
    waiting, _ = decide(prefill_config(target_queue_per_replica=0), 3, reading(ttft_p=2.0, replicas_reporting=2))
    assert waiting.desired == 3 and "waiting for 1 starting replicas" in waiting.reason
    # all 3 report and it still breaches: the breach adds again (capped at 1.5x)
    ready, _ = decide(prefill_config(target_queue_per_replica=0), 3, reading(ttft_p=2.0, replicas_reporting=3))
    assert ready.desired == 5
    # demand the capacity view sizes at 6 goes ahead while replicas start
    sized = prefill_config(capacity_tokens_per_s=1_000, target_queue_per_replica=0)
    grown, _ = decide(sized, 3, reading(ttft_p=2.0, prompt_tps=6_000, replicas_reporting=2))
    assert grown.desired == 6


def test_queue_depth_scales_to_total_over_target_within_the_breach_cap():
    decision, _ = decide(prefill_config(), 4, reading(queue_total=20.0, replicas_reporting=4))
    assert (decision.desired, decision.driving_signal) == (5, "queue")  # 20 waiting / 4 per replica
    assert "queue 5.0/replica > 4" in decision.reason
    # a queue grows with time while it is not drained, not with load: one breach adds at most 1.5x what reports
    capped, _ = decide(prefill_config(), 2, reading(queue_total=20.0))
    assert capped.desired == 3
    assert capped.reason == "prefill 2\u21923: queue 10.0/replica > 4 (one breach adds at most to 3)"
    hpa, _ = decide(prefill_config(plain_hpa=True), 2, reading(queue_total=20.0))
    assert hpa.desired == 5  # the hpa-queue baseline keeps HPA's uncapped formula


def test_a_queue_does_not_compound_while_replicas_start():
    # a cold start under load: 1 of 3 decode replicas ready, 118 waiting behind its full batch
    config = decode_config(capacity_tokens_per_s=1500)
    decision, _ = decide(config, 3, reading("decode", queue_total=118.0, gen_tps=3000, replicas_reporting=1))
    assert decision.desired == 3  # 1.5 x the capacity view's 2: nothing more until the others report


def test_latency_below_target_never_shrinks_a_pool_on_its_own():
    decision, _ = decide(prefill_config(target_queue_per_replica=0), 4, reading(ttft_p=0.1, replicas_reporting=4))
    assert (decision.desired, decision.driving_signal) == (4, "latency")
    assert decision.reason == "prefill 4\u21924: TTFT p90 100 ms < 500 ms (latency alone never scales down)"


def test_an_empty_queue_never_shrinks_a_pool_on_its_own():
    decision, _ = decide(prefill_config(), 4, reading(ttft_p=0.1, queue_total=0.0, replicas_reporting=4))
    assert decision.desired == 4
    plain_hpa, state = decide(
        prefill_config(plain_hpa=True), 4, reading(queue_total=4.0, prompt_tps=9000, replicas_reporting=4)
    )
    assert plain_hpa.desired == 1  # ceil(4 * 1/4): the HPA formula the hpa-queue baseline keeps
    assert state.learned_capacity_tps is None  # and HPA has no capacity signal


def test_capacity_shrinks_a_pool_whose_latency_is_low():
    decision, _ = decide(sized_config(), 4, reading(ttft_p=0.1, prompt_tps=1500, replicas_reporting=4))
    assert (decision.desired, decision.driving_signal) == (2, "capacity")  # ceil(1500 / 1000)


@pytest.mark.parametrize(("ttft_s", "desired"), [(0.54, 2), (0.46, 2), (0.56, 3), (0.44, 2)])
def test_tolerance_band_holds_small_deviations(ttft_s, desired):
    # 0.44 s is outside the band (ratio 0.88), and a latency below target does not shrink
    decision, _ = decide(prefill_config(target_queue_per_replica=0), 2, reading(ttft_p=ttft_s))
    assert decision.desired == desired


def test_within_tolerance_reason_says_so():
    decision, _ = decide(prefill_config(), 2, reading(ttft_p=0.51))
    assert decision.reason == "prefill 2\u21922: TTFT p90 510 ms \u2248 500 ms (within tolerance)"


def test_max_over_signals_picks_the_largest_recommendation():
    decision, _ = decide(sized_config(), 2, reading(ttft_p=0.7, queue_total=20.0, prompt_tps=4_000))
    # latency says 3, capacity 4, the queue 5 (within 1.5 x the capacity view's 4)
    assert (decision.desired, decision.driving_signal) == (5, "queue")
    assert decision.pressure == pytest.approx(2.5)


def test_capacity_estimate_jumps_to_the_needed_size_in_one_step():
    config = prefill_config(capacity_tokens_per_s=5200)
    decision, _ = decide(config, 2, reading(ttft_p=0.6, prompt_tps=31_000))
    assert (decision.desired, decision.driving_signal) == (6, "capacity")  # ceil(31000 / 5200)
    assert "prompt demand 31000 tok/s > 2 x 5200 tok/s capacity" in decision.reason


def test_capacity_demand_includes_the_waiting_backlog():
    config = prefill_config(capacity_tokens_per_s=5000, target_queue_per_replica=0)
    # 10 000 tok/s at 5 req/s = 2000 tokens per request; 60 waiting drain over the 60 s window: +2000 tok/s
    decision, _ = decide(config, 2, reading(prompt_tps=10_000, request_rate=5, queue_total=60))
    assert decision.signals["capacity_tps_per_replica"] == 5000
    assert decision.desired == 3  # ceil(12000 / 5000)


def test_capacity_is_learned_only_while_the_pool_is_saturated():
    config = prefill_config()
    u = LEARNED_CAPACITY_UTILIZATION
    learned = learn_capacity(config, reading(ttft_p=0.45, prompt_tps=9000), 2, None, 0.9)  # latency at target
    assert learned == pytest.approx(4500 * u)
    again = learn_capacity(config, reading(ttft_p=2.0, prompt_tps=11_000), 2, learned, 4.0)  # over target
    assert again == pytest.approx(0.7 * 4500 * u + 0.3 * 5500 * u)
    queueing = learn_capacity(config, reading(ttft_p=0.1, queue_total=8.0, prompt_tps=10_000), 2, None, 0.2)
    assert queueing == pytest.approx(5000 * u)  # 4 waiting per replica: the queue's own target
    # a pool at 80 % of its latency target with a short queue is not saturated: its throughput is only its load
    assert learn_capacity(config, reading(ttft_p=0.4, queue_total=2.0, prompt_tps=3000), 2, None, 0.8) is None
    assert learn_capacity(config, reading(ttft_p=1.0, prompt_tps=9000), 3, None, 2.0) is None  # one not reporting
    # a latency over an unattainable target (no ratio above the floor) is no saturation
    assert learn_capacity(config, reading(ttft_p=2.0, prompt_tps=9000), 2, None, None) is None


def test_a_learned_capacity_sizes_the_pool_in_the_same_interval():
    decision, state = decide(prefill_config(), 2, reading(ttft_p=0.6, prompt_tps=20_000))
    assert state.learned_capacity_tps == pytest.approx(10_000 * LEARNED_CAPACITY_UTILIZATION)
    assert (decision.desired, decision.driving_signal) == (4, "capacity")


def test_a_configured_capacity_wins_and_is_not_learned():
    state = PoolScalerState(learned_capacity_tps=500)
    decision, state = decide(sized_config(), 2, reading(ttft_p=1.0, prompt_tps=3000), state)
    assert decision.signals["capacity_tps_per_replica"] == 1000
    assert state.learned_capacity_tps == 500


def test_scale_down_stabilization_keeps_the_max_of_the_window():
    config = sized_config(scale_down_stabilization_s=300)
    idle = reading(prompt_tps=500, replicas_reporting=5)
    state = PoolScalerState(recommendations=(Recommendation(NOW - 100, 5),))
    decision, state = decide(config, 5, idle, state)
    assert decision.desired == 5
    assert "scale-down stabilization keeps 5 (max over 300 s)" in decision.reason
    later, _ = decide(config, 5, idle, state, now=NOW + 250)
    assert later.desired == 1  # the 5 has aged out; the window now holds only the 1s recommended since


def test_fresh_state_starts_the_scale_down_window_at_first_sight():
    config = sized_config(scale_down_stabilization_s=300)
    idle = reading(ttft_p=0.05, prompt_tps=500, replicas_reporting=4)
    decision, _ = decide(config, 4, idle, fresh_state(4, NOW))
    assert decision.desired == 4
    without, _ = decide(config, 4, idle)
    assert without.desired == 1


def test_scale_up_stabilization_keeps_the_min_of_the_window():
    config = sized_config(scale_up_stabilization_s=60)
    state = PoolScalerState(recommendations=(Recommendation(NOW - 30, 2),))
    decision, state = decide(config, 2, reading(prompt_tps=6_000), state)
    assert decision.desired == 2
    assert "scale-up stabilization holds 2 (min over 60 s)" in decision.reason
    later, _ = decide(config, 2, reading(prompt_tps=6_000), state, now=NOW + 45)
    assert later.desired == 6


def test_step_limits_bound_each_interval():
    up, _ = decide(sized_config(max_scale_up_step=2), 2, reading(prompt_tps=8_000))
    assert up.desired == 4
    assert "maxScaleUpStep 2 limits to 4" in up.reason
    idle = reading(prompt_tps=500, replicas_reporting=5)
    down, _ = decide(sized_config(max_scale_down_step=1), 5, idle)
    assert down.desired == 4
    unlimited, _ = decide(sized_config(max_scale_down_step=0), 5, idle)
    assert unlimited.desired == 1


def test_bounds_clamp_recommendations_and_manual_edits():
    high, _ = decide(sized_config(max_replicas=8), 4, reading(prompt_tps=20_000, replicas_reporting=4))
    assert high.desired == 8
    assert "clamped to maxReplicas 8" in high.reason
    # a manual edit to 12 (above max) is brought back to max at once, whatever the down step
    edited, _ = decide(
        prefill_config(max_replicas=8, max_scale_down_step=1), 12, reading(ttft_p=0.5, replicas_reporting=12)
    )
    assert edited.desired == 8
    low, _ = decide(sized_config(min_replicas=2), 3, reading(prompt_tps=100, replicas_reporting=3))
    assert low.desired == 2
    assert "clamped to minReplicas 2" in low.reason


def test_missing_metrics_hold_the_current_size_and_record_nothing():
    state = PoolScalerState(recommendations=(Recommendation(NOW - 10, 3),), learned_capacity_tps=1000)
    unavailable = MetricsUnavailable("prefill", NO_SAMPLES, "no prefill replica reported")
    decision, next_state = decide(prefill_config(min_replicas=1), 3, unavailable, state)
    assert decision.desired == 3 and decision.held and decision.driving_signal is None
    assert decision.reason == "prefill 3\u21923: holding, metrics unavailable (no_samples: no prefill replica reported)"
    assert next_state == state


def test_missing_metrics_still_clamp_an_out_of_bounds_size():
    unavailable = MetricsUnavailable("prefill", NO_SAMPLES, "none")
    decision, _ = decide(prefill_config(max_replicas=4), 6, unavailable)
    assert decision.desired == 4 and decision.held


def test_reading_without_usable_signal_holds():
    decision, _ = decide(prefill_config(), 3, reading(queue_total=None, replicas_reporting=3))
    assert decision.desired == 3 and decision.held
    assert "no usable signal" in decision.reason


def test_replicas_not_yet_reporting_prevent_overshoot():
    # 4 wanted, 2 still starting: the 2 reporting see TTFT at 2x target, which 4 replicas already cover
    decision, _ = decide(prefill_config(), 4, reading(ttft_p=1.0, replicas_reporting=2))
    assert decision.desired == 4
    assert "(2 of 4 replicas reporting)" in decision.reason


def test_replicas_not_reporting_count_as_at_target_when_scaling_down():
    decision, _ = decide(sized_config(), 4, reading(prompt_tps=400, replicas_reporting=2))
    assert decision.desired == 3  # ratio (2 * 0.2 + 2) / 4 = 0.6


def test_flapping_input_does_not_flap_replicas():
    # load alternates between needing 4 and 1 replicas every interval
    config = sized_config(scale_down_stabilization_s=300, max_scale_down_step=1)
    state, current, history = PoolScalerState(), 2, []
    for step in range(40):
        needed = 4 if step % 2 == 0 else 1
        signals = reading(ttft_p=0.5 * needed / current, prompt_tps=1000.0 * needed, replicas_reporting=current)
        decision, state = decide(config, current, signals, state, now=NOW + 15 * step)
        current = decision.desired
        history.append(current)
    assert history == [4] * 40


def test_disabled_pool_keeps_its_replicas():
    decision, state = decide(prefill_config(enabled=False), 3, reading(ttft_p=5.0))
    assert decision.desired == 3 and decision.reason == "prefill 3\u21923: autoscaling disabled"
    assert state == PoolScalerState()


def test_history_is_pruned_to_the_longest_window():
    config = prefill_config(scale_down_stabilization_s=60)
    state = PoolScalerState(recommendations=(Recommendation(NOW - 100, 9), Recommendation(NOW - 30, 4)))
    _, state = decide(config, 4, reading(ttft_p=0.5, replicas_reporting=4), state)
    assert [r.at for r in state.recommendations] == [NOW - 30, NOW]


def test_decision_is_frozen_and_deterministic():
    first = decide(prefill_config(), 2, reading(ttft_p=0.812))
    second = decide(prefill_config(), 2, reading(ttft_p=0.812))
    assert first == second
    with pytest.raises(dataclasses.FrozenInstanceError):
        first[0].desired = 3  # type: ignore[misc]
