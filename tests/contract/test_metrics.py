"""Contract: the /metrics series the autoscaler (pdfleet.autoscale.promql.ENGINE_METRICS), the dashboards and the
alert rules query (the KV transfer dashboard's vllm:nixl_* included): exact names, types, labels and vLLM 0.32's
histogram buckets; vLLM's NIXL series after a transfer."""

from __future__ import annotations

import json
import re
from dataclasses import fields

from contract_support import (
    ENGINE_FAMILIES,
    FINISHED_REASONS,
    METRICS_SETTLE_S,
    NIXL_FAMILIES,
    Pair,
    check_family,
    post,
    scrape,
    wait_for,
)

from pdfleet.autoscale.promql import ENGINE_METRICS
from pdfleet.chart import alerts, dashboards
from pdfleet.router import handshake

_VLLM_NAME = re.compile(r"vllm(?::|\[:_\])([a-z0-9_]+)")  # vllm:x, or the autoscaler's matcher vllm[:_]x
_SUFFIXES = ("_bucket", "_count", "_sum")


def chart_queries() -> list[str]:
    """Every PromQL expression of the dashboards and the alert rules."""
    return [expr for _, _, expr in dashboards.panel_queries()] + [alert.expr for alert in alerts.alerts()]


def queried_vllm_samples() -> set[str]:
    """Every vllm: sample name the autoscaler, the dashboards and the alerts select (e.g. `..._bucket`)."""
    names = {getattr(ENGINE_METRICS["vllm"], f.name) for f in fields(ENGINE_METRICS["vllm"])}
    for expr in chart_queries():
        names |= {"vllm:" + name for name in _VLLM_NAME.findall(expr)}
    return names


def family_of(sample: str) -> str:
    for suffix in _SUFFIXES:
        if sample.endswith(suffix):
            return sample[: -len(suffix)]
    return sample


def test_engine_series_names_types_labels_and_buckets(pair: Pair) -> None:
    post(pair.decode, "/v1/completions", {"model": pair.model, "prompt": "warm up", "max_tokens": 2}).raise_for_status()
    for engine in pair.engines:
        metrics = scrape(engine)
        for name, (kind, buckets) in ENGINE_FAMILIES.items():
            check_family(metrics, name, kind, buckets, pair.model)
        reasons = {labels["finished_reason"] for labels in metrics.label_sets("vllm:request_success_total")}
        assert reasons == FINISHED_REASONS  # every reason exported from the start, 0 until counted
        assert 0.0 <= metrics.value("vllm:kv_cache_usage_perc") <= 1.0  # a fraction, not a percentage


def test_every_vllm_series_the_autoscaler_dashboards_and_alerts_query_exists(pair: Pair) -> None:
    queried = queried_vllm_samples()
    scan_works = {
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:num_requests_waiting",
        "vllm:nixl_bytes_transferred_sum",
    }
    assert scan_works <= queried
    contract = ENGINE_FAMILIES | NIXL_FAMILIES
    for engine in pair.engines:
        metrics = scrape(engine)
        for sample in sorted(queried):
            family = family_of(sample)
            assert family in contract, f"{sample} is queried but not in this suite's contract: add it"
            if sample == family and contract[family][0] == "histogram":
                sample += "_count"  # a histogram named by its family (ENGINE_METRICS): its series exist
            assert metrics.has(sample), f"{engine.role}: {sample} is queried but not exported"


def test_nixl_series_after_a_transfer(pair: Pair) -> None:
    body = {"model": pair.model, "prompt": "NIXL metrics probe " + "x y z " * 60, "max_tokens": 4, "temperature": 0}
    before = scrape(pair.decode)
    stage1 = post(pair.prefill, "/v1/completions", handshake.prefill_request_body(body))
    assert stage1.status_code == 200, stage1.text
    kv_json = handshake.kv_transfer_params_json(stage1.content)
    assert kv_json is not None
    stage2 = post(
        pair.decode, "/v1/completions", handshake.decode_request_body(json.dumps(body).encode(), body, kv_json)
    )
    assert stage2.status_code == 200, stage2.text

    def transferred():
        now = scrape(pair.decode)
        count = "vllm:nixl_xfer_time_seconds_count"
        return now if now.value(count) > before.value(count) else None

    metrics = wait_for(transferred, METRICS_SETTLE_S, "vllm:nixl_xfer_time_seconds_count to grow on the decode")
    for name, (kind, buckets) in NIXL_FAMILIES.items():
        check_family(metrics, name, kind, buckets, pair.model)
    moved = metrics.value("vllm:nixl_bytes_transferred_sum") - before.value("vllm:nixl_bytes_transferred_sum")
    assert moved > 0
    assert metrics.value("vllm:nixl_num_failed_transfers_total") == before.value("vllm:nixl_num_failed_transfers_total")
