"""PromQL text, query results -> PoolSignals, and spec -> policy config (all pure)."""

from __future__ import annotations

import pytest

from pdfleet.autoscale.config import policy_config_from_spec
from pdfleet.autoscale.promql import Signal, fleet_queries, fleet_selector, metric_names, queries_per_interval, series
from pdfleet.autoscale.signals import (
    NO_SAMPLES,
    MetricsUnavailable,
    PoolSignals,
    TokenHistogram,
    complete_reading,
    signals_from_results,
)


def test_one_query_per_signal_covers_both_pools():
    queries = fleet_queries("vllm", "inference", "llama", 60, 90)
    assert [q.signal for q in queries] == list(Signal)
    assert queries_per_interval() == len(Signal) == 11
    assert all("by (pool" in q.promql and 'pool=~"prefill|decode"' in q.promql for q in queries)
    assert all(q.doc and q.unit for q in queries)


def test_ttft_query_is_a_histogram_quantile_over_rate_summed_by_le():
    ttft = fleet_queries("vllm", "inference", "llama", 60, 90)[0]
    assert ttft.promql == (
        'histogram_quantile(0.9, sum by (pool, le) (rate({__name__=~"vllm[:_]time_to_first_token_seconds_bucket",'
        'namespace="inference",pdd="llama",pool=~"prefill|decode"}[60s])))'
    )


def test_sglang_queries_use_sglang_names():
    promql = " ".join(q.promql for q in fleet_queries("sglang", "ns", "x", 30, 99))
    for name in ("sglang[:_]num_queue_reqs", "sglang[:_]inter_token_latency_seconds_bucket", "sglang[:_]token_usage"):
        assert name in promql
    assert "vllm" not in promql and "histogram_quantile(0.99," in promql and "[30s]" in promql
    # SGLang exports no per-request computed-prompt histogram: its fleets decide without that optional signal
    assert {Signal.PREFILL_TOKENS, Signal.COMPUTED_TPS}.isdisjoint(
        q.signal for q in fleet_queries("sglang", "ns", "x", 30, 99)
    )


def test_selector_quotes_label_values():
    assert fleet_selector("ns", 'a"b\\c') == 'namespace="ns",pdd="a\\"b\\\\c",pool=~"prefill|decode"'
    assert series("vllm:num_requests_waiting", 'pdd="x"') == '{__name__=~"vllm[:_]num_requests_waiting",pdd="x"}'


def test_unknown_engine_and_bad_percentile_are_rejected():
    with pytest.raises(ValueError, match="unknown engine kind"):
        metric_names("trtllm")
    with pytest.raises(ValueError, match="percentile"):
        fleet_queries("vllm", "ns", "x", 60, 100)


def _vector(**by_pool):
    return [{"metric": {"pool": pool}, "value": [1.0, value]} for pool, value in by_pool.items()]


def test_results_become_pool_signals():
    results = {
        Signal.TTFT_P: _vector(prefill="0.9", decode="NaN"),
        Signal.ITL_P: _vector(prefill="NaN", decode="0.047"),
        Signal.QUEUE_TOTAL: _vector(prefill="8", decode="1"),
        Signal.RUNNING_TOTAL: _vector(prefill="6", decode="32"),
        Signal.KV_USAGE: _vector(prefill="0.3", decode="0.75"),
        Signal.PROMPT_TPS: _vector(prefill="4000", decode="0"),
        Signal.GEN_TPS: _vector(prefill="20", decode="+Inf"),
        Signal.REQUEST_RATE: _vector(prefill="5"),
        Signal.REPLICAS_REPORTING: _vector(prefill="2", decode="1"),
    }
    readings = signals_from_results(results, fetched_at=42.0)
    assert readings["prefill"] == PoolSignals("prefill", 0.9, None, 8, 6, 0.3, 4000, 20, 5, 2, 42.0)
    decode = readings["decode"]
    assert decode.ttft_p is None and decode.itl_p == 0.047  # NaN: no request in the window
    assert decode.gen_tps is None and decode.request_rate is None  # non-finite or absent: no value, not zero
    assert decode.queue_per_replica == 1.0


def test_pool_without_reporting_replicas_is_unavailable():
    results = {Signal.QUEUE_TOTAL: _vector(prefill="0"), Signal.REPLICAS_REPORTING: _vector(prefill="1")}
    readings = signals_from_results(results, fetched_at=1.0)
    assert isinstance(readings["prefill"], PoolSignals) and readings["prefill"].queue_total == 0
    assert isinstance(readings["decode"], MetricsUnavailable) and readings["decode"].reason == NO_SAMPLES


def test_empty_results_are_unavailable_not_zero():
    readings = signals_from_results({signal: [] for signal in Signal}, fetched_at=1.0)
    assert {r.reason for r in readings.values()} == {NO_SAMPLES}


def test_policy_config_from_the_api_model():
    model = pytest.importorskip("pdfleet.api.model")
    spec = model.PDDeploymentSpec.model_validate(
        {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"kind": "sglang"},
            "prefill": {
                "gpusPerReplica": 2,
                "autoscaling": {"enabled": True, "maxReplicas": 6, "targetLatencyMs": 400},
            },
            "decode": {"autoscaling": {"enabled": True, "maxScaleDownStep": 2}},
            "sla": {"ttftMs": 500, "tpotMs": 40, "percentile": 95},
            "autoscaler": {"windowSeconds": 30, "gpuBudget": 24, "pdRatio": {"min": 0.25, "max": 2}},
        }
    )
    config = policy_config_from_spec(spec, capacity_tokens_per_s={"prefill": 8000})
    assert (config.prefill.target_latency_ms, config.decode.target_latency_ms) == (400, 40)
    assert config.prefill.max_replicas == 6 and config.prefill.gpus_per_replica == 2
    assert config.decode.max_scale_down_step == 2 and config.decode.scale_down_stabilization_s == 300
    assert (config.prefill.capacity_tokens_per_s, config.decode.capacity_tokens_per_s) == (8000, None)
    assert (config.percentile, config.window_s, config.gpu_budget) == (95, 30, 24)
    assert (config.pd_ratio_min, config.pd_ratio_max, config.engine_kind) == (0.25, 2, "sglang")


def _buckets(pool, *bounds_and_rates):
    return [{"metric": {"pool": pool, "le": le}, "value": [1.0, rate]} for le, rate in bounds_and_rates]


def test_prefill_token_buckets_become_a_histogram_and_are_optional():
    scalars = {signal: _vector(prefill="1") for signal in Signal if signal is not Signal.PREFILL_TOKENS}
    with_buckets = {**scalars, Signal.PREFILL_TOKENS: _buckets("prefill", ("+Inf", "4"), ("1000", "1"), ("2000", "3"))}
    reading = signals_from_results(with_buckets, fetched_at=1.0)["prefill"]
    assert reading.prefill_tokens == TokenHistogram(((1000.0, 1.0), (2000.0, 3.0), (float("inf"), 4.0)))
    # an engine without the histogram is no missing signal: the policy falls back to the mean prompt
    without = complete_reading(signals_from_results(scalars, fetched_at=1.0)["prefill"])
    assert isinstance(without, PoolSignals) and without.prefill_tokens is None


def test_token_histogram_quantile_and_share_interpolate_like_histogram_quantile():
    # 1 req/s up to 1000 tokens, 2 more up to 2000, 1 more past 5000
    histogram = TokenHistogram(((1000.0, 1.0), (2000.0, 3.0), (5000.0, 3.0), (float("inf"), 4.0)))
    assert histogram.quantile(0.25) == 1000.0
    assert histogram.quantile(0.5) == pytest.approx(1500.0)
    assert histogram.quantile(0.9) == 5000.0  # in the +Inf bucket: the highest finite bound
    assert histogram.share_above(1500.0) == pytest.approx(0.5)
    assert histogram.share_above(500.0) == pytest.approx(0.875)
    assert histogram.share_above(6000.0) == pytest.approx(0.25)  # the +Inf bucket counts as over
    assert TokenHistogram(()).quantile(0.9) is None and TokenHistogram(((float("inf"), 0.0),)).share_above(1) is None
