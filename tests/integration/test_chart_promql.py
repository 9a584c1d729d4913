"""Every dashboard panel query and alert rule evaluated by a real Prometheus scraping real processes: engine emulators
(a prefill and a decode), the router in front of them, the operator with its autoscaler on the real control plane, and
and the fleet-state gauges the operator exports. A panel whose query returns nothing fails the test."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client

from pdfleet import API_GROUP, API_VERSION, PLURAL
from pdfleet.chart import alerts, dashboards
from pdfleet.localfleet.operator_process import OperatorProcess
from pdfleet.localfleet.prometheus import PrometheusServer, ScrapeTarget, prometheus_binary, start_prometheus
from pdfleet.testing.builders import pdd_body, pdd_spec
from pdfleet.testing.engine_process import EngineProcess, start_engine
from pdfleet.testing.router_process import RouterProcess

pytestmark = pytest.mark.skipif(prometheus_binary() is None, reason="prometheus not installed (Debian package)")

PDD, MODEL, RACK = "obs", "obs-model", "rack-a"
# Grafana's variables, sized for a 1 s scrape interval and a run of tens of seconds
GRAFANA = {"$__rate_interval": "15s", "$__range": "30s", "$__interval": "2s", "$pdd": PDD}
LONG_PROMPT = "tell me about racks " * 100  # above disaggregateMinPromptTokens: prefill then decode
SHORT_PROMPT = "hi"  # below it: straight to decode
WAIT_S = 45.0


def fleet_spec(prometheus_url: str) -> dict[str, Any]:
    """Autoscaled pools with SLA targets no engine can meet, so both pools scale up to their max (and alerts fire);
    the prefill's GPU is named, so the performance model gives it a latency floor (and its unattainable share)."""
    scaling = {"enabled": True, "minReplicas": 1, "maxReplicas": 2}
    return pdd_spec(
        model="Qwen/Qwen2.5-0.5B-Instruct",
        served_name=MODEL,
        prefill={"replicas": 1, "autoscaling": scaling, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
        decode={"replicas": 1, "autoscaling": scaling},
        sla={"ttftMs": 0.001, "tpotMs": 0.001},
        autoscaler={"intervalSeconds": 1, "windowSeconds": 10},
        prometheus={"url": prometheus_url},
    )


@pytest.fixture
def engines() -> Iterator[tuple[EngineProcess, EngineProcess]]:
    """A prefill whose first two KV pulls fail (router retries and falls back) and a decode, in one rack."""
    speed = ("--emulator-speedup", "20")
    prefill = start_engine(
        "prefill", rack=RACK, served_model_name=MODEL, extra_args=(*speed, "--fault-fail-kv-source", "2")
    )
    try:
        decode = start_engine("decode", rack=RACK, served_model_name=MODEL, extra_args=speed)
        try:
            yield prefill, decode
        finally:
            decode.stop()
    finally:
        prefill.stop()


def send_traffic(router: RouterProcess, requests: int) -> list[int]:
    """Streamed completions, long and short prompts alternating; returns the HTTP statuses."""
    statuses = []
    with httpx.Client(base_url=f"http://127.0.0.1:{router.port}", timeout=30) as http:
        for i in range(requests):
            body = {
                "model": MODEL,
                "prompt": LONG_PROMPT if i % 2 == 0 else SHORT_PROMPT,
                "max_tokens": 8,
                "stream": True,
            }
            with http.stream("POST", "/v1/completions", json=body) as reply:
                reply.read()
                statuses.append(reply.status_code)
    return statuses


def instant(prometheus: PrometheusServer, expr: str) -> list[dict[str, Any]]:
    """Evaluate `expr` now; raises on a PromQL error."""
    reply = httpx.get(f"{prometheus.url}/api/v1/query", params={"query": expr}, timeout=10)
    assert reply.status_code == 200, f"{expr}\n{reply.text}"
    return reply.json()["data"]["result"]


def has_finite_value(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in result)


def concrete(expr: str, namespace: str) -> str:
    """A dashboard query with Grafana's variables replaced, as Grafana would send it."""
    for variable, value in {**GRAFANA, "$namespace": namespace}.items():
        expr = expr.replace(variable, value)
    return expr


def test_every_panel_and_alert_signal_returns_data(
    engines: tuple[EngineProcess, EngineProcess], namespace: str, kube: Any, pdfleet_operator: OperatorProcess
) -> None:
    prefill, decode = engines
    target = {"namespace": namespace, "pdd": PDD, "rack": RACK}
    custom = client.CustomObjectsApi(kube)
    router = RouterProcess(
        {
            "version": 1,
            "generation": 1,
            "model": MODEL,
            "endpoints": [
                {"name": f"{PDD}-prefill-{RACK}-0", "pool": "prefill", "url": prefill.url, "rack": RACK, "zone": "z1"},
                {"name": f"{PDD}-decode-{RACK}-0", "pool": "decode", "url": decode.url, "rack": RACK, "zone": "z1"},
            ],
            "policy": {"maxPrefillRetries": 1, "maxDecodeRetries": 1},
        },
        ["--health-interval", "0.5", "--shutdown-grace", "1"],
    )
    try:
        scrape = [
            ScrapeTarget(f"127.0.0.1:{prefill.port}", {**target, "pool": "prefill", "pod": f"{PDD}-prefill-{RACK}-0"}),
            ScrapeTarget(f"127.0.0.1:{decode.port}", {**target, "pool": "decode", "pod": f"{PDD}-decode-{RACK}-0"}),
            ScrapeTarget(
                f"127.0.0.1:{router.admin_port}", {"namespace": namespace, "pdd": PDD, "pod": f"{PDD}-router-0"}
            ),
            # the operator's series (autoscaler decisions, fleet-state gauges) carry namespace/pdd themselves
            ScrapeTarget(f"127.0.0.1:{pdfleet_operator.metrics_port}"),
        ]
        with start_prometheus(scrape, scrape_interval=1.0) as prometheus:
            custom.create_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, PLURAL, pdd_body(PDD, fleet_spec(prometheus.url))
            )
            prometheus.wait_for_healthy_targets(len(scrape))
            panels = [(uid, title, concrete(expr, namespace)) for uid, title, expr in dashboards.panel_queries()]
            signals = [(a.name, a.signal) for a in alerts.alerts()]
            firing = {"PDFleetTTFTSLABreach", "PDFleetTPOTSLABreach", "PDFleetPoolAtMaxReplicas"}
            deadline = time.monotonic() + WAIT_S
            while True:
                statuses = send_traffic(router, 6)
                empty = [
                    f"{uid} / {title}: {expr}"
                    for uid, title, expr in panels
                    if not has_finite_value(instant(prometheus, expr))
                ]
                empty += [f"alert signal {name}: {expr}" for name, expr in signals if not instant(prometheus, expr)]
                silent = sorted(a.name for a in alerts.alerts() if a.name in firing and not instant(prometheus, a.expr))
                if (not empty and not silent) or time.monotonic() > deadline:
                    break
            assert not empty, "queries without data:\n" + "\n".join(empty)
            assert not silent, f"alerts that should fire on impossible SLAs and pools at max: {silent}"
            for alert in alerts.alerts():
                instant(prometheus, alert.expr)  # every full rule evaluates (firing or not)
            assert set(statuses) == {200}, statuses
    finally:
        router.stop()
