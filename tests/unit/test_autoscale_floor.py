"""Scaling on what replicas change: the latency floor, unattainable targets, idle pools, decode's KV-bound capacity."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pdfleet.autoscale.config import PoolPolicyConfig
from pdfleet.autoscale.policy import (
    FLOOR_LEARN_MAX_UTILIZATION,
    LATENCY_BREACH_MIN_UTILIZATION,
    LEARNED_CAPACITY_UTILIZATION,
    MAX_FLOOR_CORRECTION,
    PoolScalerState,
    decide_pool,
    fresh_state,
    learn_capacity,
    learn_floor_correction,
    modelled_floor_s,
    prefill_utilization,
)
from pdfleet.autoscale.signals import PoolSignals, TokenHistogram
from pdfleet.perfmodel.replica import longest_prefill_within, prefill_throughput, prefill_ttft, replica_model

NOW = 10_000.0
REPLICA = replica_model("meta-llama/Llama-3.1-8B-Instruct", "NVIDIA-H100-80GB-HBM3", 1)
LONG = 30_000  # prompt tokens: about 1.46 s of prefill on an idle replica


def reading(pool: str = "prefill", **values) -> PoolSignals:
    """4 replicas serving 1 req/s of LONG-token prompts and 200-token outputs, nothing queued."""
    base = dict(
        pool=pool,
        ttft_p=1.6,
        itl_p=0.01,
        queue_total=0.0,
        running_total=2.0,
        kv_usage=0.1,
        prompt_tps=float(LONG),
        gen_tps=200.0,
        request_rate=1.0,
        replicas_reporting=4,
        fetched_at=NOW,
    )
    base.update(values)
    return PoolSignals(**base)


def config(pool: str = "prefill", **overrides) -> PoolPolicyConfig:
    base = dict(
        pool=pool,
        max_replicas=64,
        target_latency_ms=500 if pool == "prefill" else 50,
        scale_down_stabilization_s=0,
        max_scale_up_step=0,
        max_scale_down_step=0,
        capacity_tokens_per_s=LONG / 4,  # the pool is as large as its load needs: only latency can move it
        replica_model=REPLICA,
    )
    base.update(overrides)
    return PoolPolicyConfig(**base)


def decide(cfg, current, signals, state=PoolScalerState(), now=NOW):
    return decide_pool(cfg, current, signals, state, now, percentile=90, window_s=60)


def test_a_target_below_the_requests_floor_adds_no_replica_and_is_reported() -> None:
    # 6x the target with a queue (so the reading teaches no floor), but 1.46 s of it is the prompts' own prefill
    decision, _ = decide(config(), 4, reading(ttft_p=3.0, queue_total=2.0))
    assert decision.desired == 4
    assert "no replica count meets it" in decision.unattainable and "500 ms" in decision.unattainable
    assert decision.signals["target_unattainable"] == 1.0
    assert decision.signals["latency_floor_ms"] == pytest.approx(prefill_ttft(REPLICA, LONG) * 1000)


def test_the_floor_is_the_percentiles_prompt_and_the_share_over_it_is_reported() -> None:
    # a bimodal mix: 90 % chat of ~1,000 computed tokens, 10 % documents of ~30,000; the mean (3,900) hides both
    mix = TokenHistogram(((1000.0, 0.9), (2000.0, 0.9), (20000.0, 0.9), (50000.0, 1.0), (float("inf"), 1.0)))
    signals = reading(prompt_tps=3900.0, prefill_tokens=mix)
    p80 = modelled_floor_s(config(), signals, percentile=80)
    p95 = modelled_floor_s(config(), signals, percentile=95)
    assert p80 == pytest.approx(prefill_ttft(REPLICA, 1000 * 0.8 / 0.9))  # inside the chat bucket
    assert p95 == pytest.approx(prefill_ttft(REPLICA, 35000))  # halfway through the documents' bucket
    # 500 ms at p90: the chat requests can meet it, the documents cannot, whatever the replica count
    decision, _ = decide(config(), 4, reading(ttft_p=0.4, prompt_tps=3900.0, prefill_tokens=mix))
    assert decision.unattainable == ""
    assert decision.signals["unattainable_requests_ratio"] == pytest.approx(0.1)
    assert 2000 < longest_prefill_within(REPLICA, 0.5) < 20000
    # at p95 the target sits under the percentile's own floor: nothing to scale, said so
    strict, _ = decide_pool(
        config(), 4, reading(ttft_p=1.5, prompt_tps=3900.0, prefill_tokens=mix), PoolScalerState(), NOW, 95
    )
    assert strict.desired <= 4 and "no replica count meets it" in strict.unattainable


def test_without_the_prompt_histogram_the_floor_is_the_mean_prompts() -> None:
    decision, _ = decide(config(), 4, reading(ttft_p=3.0, queue_total=2.0))
    assert "unattainable_requests_ratio" not in decision.signals
    assert modelled_floor_s(config(), reading()) == pytest.approx(prefill_ttft(REPLICA, LONG))


def test_latency_scales_on_the_part_above_the_floor() -> None:
    floor_ms = prefill_ttft(REPLICA, LONG) * 1000  # ~1460 ms
    cfg = config(target_latency_ms=2000)
    within, _ = decide(cfg, 4, reading(ttft_p=(floor_ms + 400) / 1000, queue_total=2.0))  # 400 of 540 ms allowed
    assert (within.desired, within.unattainable) == (4, "")
    over, _ = decide(cfg, 4, reading(ttft_p=(floor_ms + 810) / 1000, queue_total=2.0))  # 1.5x what it allows
    assert over.desired == 6 and "floor" in over.cause
    assert over.signals["target_unattainable"] == 0.0


def test_the_floor_is_corrected_by_what_an_unqueued_pool_shows() -> None:
    modelled = modelled_floor_s(config(), reading())
    state = PoolScalerState()
    for _ in range(30):  # the p90 of an unqueued pool: its longest prompts take twice the mean's prefill
        _, state = decide(config(target_latency_ms=2500), 4, reading(ttft_p=2 * modelled, running_total=3.0), state)
    assert state.floor_correction == pytest.approx(2.0, rel=0.01)
    decision, _ = decide(config(target_latency_ms=2500), 4, reading(ttft_p=3.5, queue_total=6.0), state)
    assert decision.unattainable  # 2 x 1.46 s > 2.5 s: no replica count meets it
    queued, kept = decide(config(), 4, reading(ttft_p=9.0, queue_total=40.0), state)
    assert kept.floor_correction == state.floor_correction  # a queueing pool's TTFT is not its floor


def test_an_idle_pool_shrinks_to_its_minimum_after_the_window_without_a_capacity() -> None:
    cfg = config(capacity_tokens_per_s=None, replica_model=None, scale_down_stabilization_s=300, max_scale_down_step=1)
    idle = reading(ttft_p=None, itl_p=None, running_total=0.0, prompt_tps=0.0, gen_tps=0.0, request_rate=0.0)
    state = fresh_state(6, NOW)
    held, state = decide(cfg, 6, idle, state, NOW + 15)
    assert held.desired == 6  # within the scale-down stabilization window
    current = 6
    for t in range(30, 1200, 15):
        decision, state = decide(cfg, current, idle, state, NOW + t)
        current = decision.desired
    assert current == 1 and decision.driving_signal == "idle"


def test_decode_capacity_is_not_learned_from_a_queue_burst_nor_derated() -> None:
    cfg = config("decode", capacity_tokens_per_s=None)
    burst = reading("decode", itl_p=0.02, queue_total=40.0, gen_tps=8000.0, kv_usage=0.3)
    assert learn_capacity(cfg, burst, 4, None, 0.4) is None  # KV pulls waiting say nothing of decode's capacity
    full = reading("decode", itl_p=0.02, gen_tps=8000.0, kv_usage=0.95)
    assert learn_capacity(cfg, full, 4, None, 0.4) == pytest.approx(2000.0)  # KV-bound: all of it, no 0.5
    prefill = learn_capacity(config(capacity_tokens_per_s=None), reading(queue_total=40.0), 4, None, 0.4)
    assert prefill == pytest.approx(LONG / 4 * LEARNED_CAPACITY_UTILIZATION)  # prefill keeps its headroom


def test_queueing_inside_the_window_is_not_learned_as_floor() -> None:
    modelled = modelled_floor_s(config(), reading())
    # nothing waits at the instant of the reading, but the window's p90 is 17x the prefill: a queue came and went
    assert learn_floor_correction(config(), reading(ttft_p=17 * modelled), 4, None) is None
    assert learn_floor_correction(config(), reading(ttft_p=17 * modelled), 4, 2.0) == 2.0
    # 3 replicas at ~half their back-to-back throughput: prompts meet each other, the TTFT is not their own prefill
    busy = reading(ttft_p=2 * modelled, replicas_reporting=3)
    assert busy.prompt_tps > FLOOR_LEARN_MAX_UTILIZATION * 3 * prefill_throughput(REPLICA, LONG)
    assert learn_floor_correction(config(), busy, 3, None) is None
    assert learn_floor_correction(config(), reading(ttft_p=2 * modelled), 4, None) == pytest.approx(2.0)
    assert MAX_FLOOR_CORRECTION >= 2.0


def test_an_over_provisioned_pool_raises_its_learned_capacity_and_shrinks() -> None:
    cfg = config(capacity_tokens_per_s=None, target_latency_ms=2500)
    # an early burst taught 3750 tok/s per replica: 8 replicas for LONG tok/s, whose TTFT sits at its floor
    state = PoolScalerState(learned_capacity_tps=LONG / 8)
    current = 8
    for _ in range(20):
        decision, state = decide(
            cfg, current, reading(ttft_p=1.6, running_total=1.0, replicas_reporting=current), state
        )
        current = decision.desired
    assert current <= 4 and state.learned_capacity_tps >= LONG / 4
    # only upward, and only with headroom: near its target the pool teaches nothing new
    assert learn_capacity(cfg, reading(), 4, 20_000.0, 0.2) == 20_000.0
    assert learn_capacity(cfg, reading(), 4, LONG / 4, 0.7) == LONG / 4
    # a lightly loaded pool's rate is under its learned capacity even over its share of headroom: nothing learned
    assert learn_capacity(cfg, reading(prompt_tps=LONG / 4), 4, LONG / 2, 0.2) == LONG / 2
    decode = learn_capacity(
        config("decode", capacity_tokens_per_s=None), reading("decode", gen_tps=8000.0), 4, 1900.0, 0.3
    )
    assert decode == pytest.approx(0.7 * 1900 + 0.3 * 2000 / 0.5)


def test_a_latency_over_target_at_low_utilization_is_the_prompts_tail_not_queueing() -> None:
    cfg = config(target_latency_ms=2500)
    busy, _ = decide(cfg, 4, reading(ttft_p=4.0, queue_total=2.0))  # 4 replicas at ~36 % of their throughput
    assert busy.desired > 4 and busy.driving_signal == "latency"
    quiet_reading = reading(ttft_p=4.0, queue_total=2.0, replicas_reporting=8)  # the same load on 8: ~18 %
    assert prefill_utilization(cfg, quiet_reading) < LATENCY_BREACH_MIN_UTILIZATION
    quiet, _ = decide(replace(cfg, capacity_tokens_per_s=LONG / 8), 8, quiet_reading)
    assert quiet.desired == 8 and quiet.driving_signal == "capacity"


def test_the_first_saturated_window_after_a_quiet_one_teaches_no_capacity() -> None:
    cfg = config(capacity_tokens_per_s=None)
    quiet, burst = reading(queue_total=0.0), reading(queue_total=40.0)  # the burst's queue is now, its rate a window's
    _, state = decide(cfg, 4, quiet)
    assert state.saturated is False
    _, state = decide(cfg, 4, burst, state, NOW + 15)
    assert state.learned_capacity_tps is None and state.saturated is True
    _, state = decide(cfg, 4, burst, state, NOW + 30)  # still saturated a window later: its rate is the service rate
    assert state.learned_capacity_tps == pytest.approx(LONG / 4 * LEARNED_CAPACITY_UTILIZATION)


def test_a_latency_within_tolerance_of_its_target_adds_nothing_however_close_the_floor() -> None:
    # the floor is 1.46 s, the target 1.6 s: 1.7 s is 1.7x the 140 ms the target leaves, but only 6 % over the target
    cfg = config(target_latency_ms=1600)
    busy = dict(queue_total=1.0)  # something queued: the reading teaches no floor correction
    near, _ = decide(cfg, 4, reading(ttft_p=1.7, **busy))
    assert (near.desired, near.driving_signal) == (4, "capacity")  # the latency recommends nothing
    far, _ = decide(cfg, 4, reading(ttft_p=1.9, **busy))
    assert far.desired > 4 and far.driving_signal == "latency"


def test_a_decode_queue_with_batch_and_kv_to_spare_waits_on_transfers_not_replicas() -> None:
    # vLLM counts requests still pulling their KV as waiting: 6 per replica, but 20 of 256 slots and 7 % KV in use
    cfg = config("decode")
    pulling = reading("decode", queue_total=24.0, running_total=80.0, kv_usage=0.07, itl_p=0.018)
    decision, _ = decide(cfg, 4, pulling)
    assert decision.driving_signal != "queue" and decision.desired <= 4
    # a full KV cache, a full batch or an ITL at target: the queue is a shortage again
    for full in (dict(kv_usage=0.95), dict(running_total=4 * 256.0), dict(itl_p=0.05)):
        short, _ = decide(cfg, 4, replace(pulling, **full))
        assert (short.desired, short.driving_signal) == (6, "queue"), full
