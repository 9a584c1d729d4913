"""Router metrics exposition (pdfleet.router.metrics)."""

from __future__ import annotations

from pdfleet.router.metrics import LightHistogram, RouterMetrics


def test_histogram_buckets_are_cumulative() -> None:
    h = LightHistogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 3.0):
        h.observe(v)
    assert h.cumulative() == [("0.1", 2), ("1.0", 3), ("+Inf", 4)]
    assert h.sum == 3.65


def test_exposition_has_the_contract_names() -> None:
    m = RouterMetrics(lambda: [("d-a", "decode", 3, True)])
    m.requests[("disaggregated", 200)] += 2
    m.retries["prefill"] += 1
    m.pairs["same_rack"] += 2
    m.kv_handshake_failures["decode_upstream_5xx"] += 1
    m.fallbacks += 1
    m.ttft.observe(0.2)
    text = m.render().decode()
    for sample in (
        'pdfleet_router_requests_total{path="disaggregated",status="200"} 2.0',
        'pdfleet_router_retries_total{leg="prefill"} 1.0',
        'pdfleet_router_pairs_total{locality="same_rack"} 2.0',
        'pdfleet_router_kv_handshake_failures_total{reason="decode_upstream_5xx"} 1.0',
        "pdfleet_router_fallbacks_total 1.0",
        'pdfleet_router_inflight{endpoint="d-a",pool="decode"} 3.0',
        'pdfleet_router_endpoint_healthy{endpoint="d-a",pool="decode"} 1.0',
        "pdfleet_router_ttft_seconds_count 1.0",
        "pdfleet_router_tpot_seconds_count 0.0",
    ):
        assert sample in text, sample
