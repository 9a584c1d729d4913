"""Every query of the chart's Grafana dashboards returns data against a live fleet under load (with a KV-transfer
fault, so the failure panels have something to show)."""

from __future__ import annotations

import httpx
import pytest

from e2e_support import e2e_pdd
from pdfleet.localfleet.harness import LocalFleet
from pdfleet.render.fleet_view import pod_url
from pdfleet.testing.load import BackgroundLoad, Phase, phased_trace

dashboards = pytest.importorskip("pdfleet.chart.dashboards")


def concrete(expr: str, namespace: str, name: str) -> str:
    """A dashboard query with Grafana's variables filled in."""
    values = {"$__rate_interval": "1m", "$__interval": "5s", "$__range": "2m", "$namespace": namespace, "$pdd": name}
    for variable, value in values.items():
        expr = expr.replace(variable, value)
    return expr


@pytest.mark.timeout(150)
def test_every_dashboard_query_returns_data(fleet: LocalFleet, namespace: str):
    fleet.apply(e2e_pdd(fleet, "dash", namespace, prefill=1, decode=1, autoscale=["prefill"], max_replicas=2))
    fleet.wait_serving(namespace, "dash")
    prefill = fleet.pods(namespace, "dash", "prefill")[0]
    httpx.post(
        pod_url(prefill["status"]["podIP"], 8000) + "/internal/faults",
        json={"fail_kv_source": 2},
        trust_env=False,
        timeout=5,
    ).raise_for_status()
    with BackgroundLoad(fleet.router_url(namespace, "dash"), phased_trace([Phase(25, 5, 1000, 8)])) as load:
        load.wait(timeout=80)
    queries = [(uid, title, concrete(expr, namespace, "dash")) for uid, title, expr in dashboards.panel_queries()]

    def empty() -> list[str]:
        return [f"{uid} / {title}: {expr}" for uid, title, expr in queries if not fleet.query(expr)]

    try:
        fleet.wait_for(lambda: not empty(), 40, "every dashboard query to return data", interval=2)
    except TimeoutError:
        missing = empty()
        pytest.fail(f"{len(missing)} of {len(queries)} dashboard queries return no data:\n" + "\n".join(missing))
