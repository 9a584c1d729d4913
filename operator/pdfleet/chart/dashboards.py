"""Grafana dashboards generated from code: fleet overview (replicas, load, SLA), SLA, autoscaler, router, KV transfer.

`dashboard_files()` renders every dashboard as Grafana JSON (schemaVersion 39, Prometheus datasource chosen by a
variable); `scripts/render_manifests.py` writes them to charts/pdfleet/dashboards/, and the chart ships each as a
ConfigMap
labelled for the Grafana dashboard sidecar. Every panel selects one PDDeployment by the `$namespace` and `$pdd`
variables. `panel_queries()` lists each panel's PromQL, which the integration test evaluates in a real Prometheus.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pdfleet.autoscale.promql import series
from pdfleet.chart.queries import (
    DASHBOARD_SELECTOR,
    ENGINE_POOLS,
    NIXL_BYTES,
    NIXL_FAILED_TRANSFERS,
    NIXL_KV_EXPIRED,
    NIXL_XFER_TIME,
    QUANTILES,
    RATE_WINDOW,
    engine_quantile,
    engine_rate,
    engine_series,
    histogram_quantile,
    quantile,
    ratio,
    share_within,
)
from pdfleet.operator import fleet_metrics as fm
from pdfleet.router.metrics import LATENCY_BUCKETS
from pdfleet.router.policy import SAME_RACK

SEL = DASHBOARD_SELECTOR
W = RATE_WINDOW
ROUTER = "pdfleet_router_"
PANEL_WIDTH, PANEL_HEIGHT, COLUMNS = 12, 8, 2


@dataclass(frozen=True)
class Query:
    """One panel target: PromQL and its legend."""

    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    """A time series (or stat) panel; `unit` is a Grafana unit id."""

    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    description: str = ""
    kind: str = "timeseries"


@dataclass(frozen=True)
class Dashboard:
    """A titled list of panels laid out two per row."""

    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def _quantile_queries(field_name: str, pool: str) -> tuple[Query, ...]:
    selector = f'{SEL}, pool="{pool}"'
    return tuple(Query(engine_quantile(q, field_name, "pool", selector, W), f"p{q * 100:g}") for q in QUANTILES)


def _target(objective: str) -> Query:
    return Query(f'{fm.SLA_TARGET_SECONDS}{{{SEL}, objective="{objective}"}}', f"{objective} target")


def _sla_compare(field_name: str, pool: str, objective: str, operator: str) -> str:
    """The pool's p90 `operator` ("/" or "<= bool") its PDDeployment's SLA target."""
    p90 = engine_quantile(0.9, field_name, "namespace, pdd", f'{SEL}, pool="{pool}"', W)
    return f'{p90} {operator} on (namespace, pdd) {fm.SLA_TARGET_SECONDS}{{{SEL}, objective="{objective}"}}'


def _attainment(objective: str, window: str) -> Query:
    """Share of the requests the router served whose client-seen TTFT or TPOT was within the SLA target."""
    target = f'scalar({fm.SLA_TARGET_SECONDS}{{{SEL}, objective="{objective}"}})'
    expr = share_within(f"{ROUTER}{objective}_seconds", LATENCY_BUCKETS, target, SEL, window)
    return Query(expr, objective.upper())


def _attainment_panel(title: str, window: str, kind: str) -> Panel:
    return Panel(
        title,
        (_attainment("ttft", window), _attainment("tpot", window)),
        unit="percentunit",
        kind=kind,
        description="Share of streamed requests (router, client-seen) within spec.sla's target, counted from the "
        "router's histogram at its largest bucket boundary at or below the target.",
    )


def _breach_ratio_panel() -> Panel:
    return Panel(
        "Engine p90 / target (above 100% = SLA breached)",
        (
            Query(_sla_compare("ttft_histogram", "prefill", "ttft", "/"), "TTFT"),
            Query(_sla_compare("itl_histogram", "decode", "tpot", "/"), "TPOT"),
        ),
        unit="percentunit",
        description="What the autoscaler and the SLA alerts act on: prefill TTFT p90 and decode inter-token p90.",
    )


def fleet_overview() -> Dashboard:
    """Replicas (spec/ready/autoscaler desired) per pool against request and token rates and the SLA."""
    return Dashboard(
        "pdfleet-fleet",
        "pdfleet / Fleet overview",
        "Per PDDeployment: prefill/decode replicas over time against the load they serve and the SLA they keep.",
        (
            Panel(
                "Replicas per pool",
                (
                    Query(f'{fm.POOL_REPLICAS}{{{SEL}, state=~"spec|ready"}}', "{{pool}} {{state}}"),
                    Query(f"{fm.AUTOSCALER_DESIRED_REPLICAS}{{{SEL}}}", "{{pool}} autoscaler desired"),
                    Query(f"{fm.AUTOSCALER_MAX_REPLICAS}{{{SEL}}}", "{{pool}} max"),
                ),
                description="spec: replicas asked for; ready: Ready pods; autoscaler desired: its last decision; "
                "max: autoscaling.maxReplicas.",
            ),
            _attainment_panel("SLA attainment", W, "timeseries"),
            Panel(
                "Request rate",
                (
                    Query(engine_rate("e2e_histogram", "pool", SEL, W, "_count"), "{{pool}} finished"),
                    Query(f"sum by (path) (rate({ROUTER}requests_total{{{SEL}}}[{W}]))", "router {{path}}"),
                ),
                unit="reqps",
            ),
            Panel(
                "Token rates",
                (
                    Query(engine_rate("prompt_tokens_counter", "pool", SEL, W), "{{pool}} prompt"),
                    Query(engine_rate("generation_tokens_counter", "pool", SEL, W), "{{pool}} generation"),
                ),
                unit="short",
                description="Tokens per second.",
            ),
            Panel(
                "Queue and running requests",
                (
                    Query(f"sum by (pool) ({engine_series('waiting_gauge', '', SEL)})", "{{pool}} waiting"),
                    Query(f"sum by (pool) ({engine_series('running_gauge', '', SEL)})", "{{pool}} running"),
                ),
            ),
            Panel(
                "KV cache usage",
                (
                    Query(f"avg by (pool) ({engine_series('kv_usage_gauge', '', SEL)})", "{{pool}} mean"),
                    Query(f"max by (pool) ({engine_series('kv_usage_gauge', '', SEL)})", "{{pool}} max"),
                ),
                unit="percentunit",
            ),
            Panel(
                "Engines reporting",
                (
                    Query(
                        f"count by (pool) (count by (pool, pod) ({engine_series('running_gauge', '', SEL)}))",
                        "{{pool}}",
                    ),
                ),
                description="Engine pods whose latest scrape succeeded.",
            ),
            _breach_ratio_panel(),
        ),
    )


def sla() -> Dashboard:
    """TTFT and TPOT percentiles against the SLA targets, and how often the targets were met."""
    return Dashboard(
        "pdfleet-sla",
        "pdfleet / SLA",
        "TTFT (prefill pool) and TPOT (decode pool, inter-token latency) against the fleet's SLA.",
        (
            Panel(
                "TTFT (prefill engines)", (*_quantile_queries("ttft_histogram", "prefill"), _target("ttft")), unit="s"
            ),
            Panel(
                "TPOT (decode engines, inter-token latency)",
                (*_quantile_queries("itl_histogram", "decode"), _target("tpot")),
                unit="s",
            ),
            Panel(
                "Client-seen TTFT and TPOT p90 (router)",
                (
                    Query(histogram_quantile(0.9, ROUTER + "ttft_seconds", "namespace, pdd", SEL, W), "TTFT p90"),
                    Query(histogram_quantile(0.9, ROUTER + "tpot_seconds", "namespace, pdd", SEL, W), "TPOT p90"),
                ),
                unit="s",
            ),
            _breach_ratio_panel(),
            _attainment_panel("SLA attainment over the range", "$__range", "stat"),
        ),
    )


def autoscaler() -> Dashboard:
    """The autoscaler's decisions and the signals behind them."""
    signal = f"{fm.AUTOSCALER_SIGNAL}{{{SEL}, signal=~"
    decisions = f"{fm.AUTOSCALER_DECISIONS}{{{SEL}}}"
    return Dashboard(
        "pdfleet-autoscaler",
        "pdfleet / Autoscaler decisions",
        "Desired replicas per pool, the signal that drove each decision, and the signals observed.",
        (
            Panel(
                "Desired vs current replicas with bounds",
                (
                    Query(f"{fm.AUTOSCALER_DESIRED_REPLICAS}{{{SEL}}}", "{{pool}} desired"),
                    Query(f"{fm.AUTOSCALER_CURRENT_REPLICAS}{{{SEL}}}", "{{pool}} current"),
                    Query(f"{fm.AUTOSCALER_MIN_REPLICAS}{{{SEL}}}", "{{pool}} min"),
                    Query(f"{fm.AUTOSCALER_MAX_REPLICAS}{{{SEL}}}", "{{pool}} max"),
                ),
            ),
            Panel(
                "Decisions by driving signal",
                (
                    Query(
                        f"sum by (pool, direction, signal) (increase({decisions}[{W}]))",
                        "{{pool}} {{direction}}: {{signal}}",
                    ),
                ),
                description="Decisions per interval window: up / down / hold, and the signal that determined each.",
            ),
            Panel("Latency signals", (Query(signal + '"(ttft|itl)_p.*_ms"}', "{{pool}} {{signal}}"),), unit="ms"),
            Panel(
                "Queue and concurrency signals",
                (
                    Query(
                        signal + '"queue_total|queue_per_replica|running_total|replicas_reporting"}',
                        "{{pool}} {{signal}}",
                    ),
                ),
            ),
            Panel(
                "Throughput signals",
                (Query(signal + '"prompt_tps|gen_tps|request_rate|capacity_tps_per_replica"}', "{{pool}} {{signal}}"),),
                description="Token and request rates per second.",
            ),
            Panel(
                "Metrics availability and drains",
                (
                    Query(f"{fm.AUTOSCALER_METRICS_AVAILABLE}{{{SEL}}}", "metrics available"),
                    Query(f"{fm.AUTOSCALER_DRAINING}{{{SEL}}}", "{{pool}} draining"),
                ),
            ),
            Panel(
                "Time since last scale",
                (Query(f"time() - {fm.AUTOSCALER_LAST_SCALE}{{{SEL}}}", "{{pool}}"),),
                unit="s",
                kind="stat",
            ),
            Panel(
                "Requests over their latency floor (unattainable)",
                (
                    Query(
                        f'{fm.AUTOSCALER_SIGNAL}{{{SEL}, signal="unattainable_requests_ratio"}}',
                        "{{pool}} requests over their floor",
                    ),
                    Query(f"{fm.AUTOSCALER_TARGET_UNATTAINABLE}{{{SEL}}}", "{{pool}} target unattainable"),
                ),
                unit="percentunit",
                description="Requests over their floor: the share of the window's requests whose own floor (their "
                "uncached prompt's prefill on an idle replica) is over the latency target, so no replica count serves "
                "them within it. Target unattainable: 100% while the pool's percentile target is below its floor "
                "(the SLAAttainable condition is False); raise the target or use faster hardware. Both need a floor: a "
                "model and gpuProduct the performance model knows.",
            ),
        ),
    )


def router() -> Dashboard:
    """Paths taken, locality, retries and per-endpoint load of the PD router."""
    requests = f"{ROUTER}requests_total{{{SEL}}}"
    pairs = f"{ROUTER}pairs_total{{{SEL}"
    return Dashboard(
        "pdfleet-router",
        "pdfleet / Router",
        "Paths taken (disaggregated / direct / fallback), same-rack pairing, retries, in-flight load.",
        (
            Panel("Paths taken", (Query(f"sum by (path) (rate({requests}[{W}]))", "{{path}}"),), unit="reqps"),
            Panel(
                "Success ratio",
                (
                    Query(
                        ratio(
                            f'sum(rate({ROUTER}requests_total{{{SEL}, status=~"2.."}}[{W}]))',
                            f"sum(rate({requests}[{W}]))",
                        ),
                        "2xx",
                    ),
                ),
                unit="percentunit",
            ),
            Panel(
                "Same-rack pair ratio",
                (
                    Query(
                        ratio(f'sum(rate({pairs}, locality="{SAME_RACK}"}}[{W}]))', f"sum(rate({pairs}}}[{W}]))"),
                        "same rack",
                    ),
                ),
                unit="percentunit",
            ),
            Panel(
                "Retries and fallbacks",
                (
                    Query(f"sum by (leg) (rate({ROUTER}retries_total{{{SEL}}}[{W}]))", "{{leg}} retries"),
                    Query(f"sum(rate({ROUTER}fallbacks_total{{{SEL}}}[{W}]))", "fallbacks"),
                ),
                unit="reqps",
            ),
            Panel("In-flight per endpoint", (Query(f"sum by (endpoint) ({ROUTER}inflight{{{SEL}}})", "{{endpoint}}"),)),
            Panel(
                "Healthy endpoints",
                (
                    Query(f"sum by (pool) ({ROUTER}endpoint_healthy{{{SEL}}})", "{{pool}} healthy"),
                    Query(f"count by (pool) ({ROUTER}endpoint_healthy{{{SEL}}})", "{{pool}} known"),
                ),
            ),
        ),
    )


def kv_transfer() -> Dashboard:
    """KV cache transfers between prefill and decode engines, from vLLM's own NIXL connector series."""
    decode, prefill = f'{SEL}, pool="decode"', f'{SEL}, pool="prefill"'
    transfers = series(NIXL_XFER_TIME + "_count", decode)
    return Dashboard(
        "pdfleet-kv-transfer",
        "pdfleet / KV transfer",
        "NIXL KV transfers as vLLM reports them (vllm:nixl_*, recorded by the decode that pulls): time, volume and "
        "failures; pairs by rack locality as the router chose them.",
        (
            Panel(
                "NIXL transfer time (decode engines)",
                tuple(
                    Query(quantile(q, series(NIXL_XFER_TIME + "_bucket", decode), "namespace, pdd", W), f"p{q * 100:g}")
                    for q in QUANTILES
                ),
                unit="s",
            ),
            Panel(
                "Transfers per second",
                (Query(f"sum by (pod) (rate({transfers}[{W}]))", "{{pod}}"),),
                unit="ops",
            ),
            Panel(
                "Bytes per second",
                (Query(f"sum(rate({series(NIXL_BYTES + '_sum', decode)}[{W}]))", "bytes"),),
                unit="Bps",
            ),
            Panel(
                "Mean transfer size",
                (
                    Query(
                        ratio(
                            f"sum(rate({series(NIXL_BYTES + '_sum', decode)}[{W}]))",
                            f"sum(rate({series(NIXL_BYTES + '_count', decode)}[{W}]))",
                        ),
                        "bytes per transfer",
                    ),
                ),
                unit="bytes",
            ),
            Panel(
                "Transfer failures and expired KV",
                (
                    Query(f"sum(rate({series(NIXL_FAILED_TRANSFERS, decode)}[{W}]))", "failed transfers (decode)"),
                    Query(
                        f"sum(rate({series(NIXL_KV_EXPIRED, prefill)}[{W}]))",
                        "KV expired unread (prefill)",
                    ),
                    Query(
                        f"sum by (reason) (rate({ROUTER}kv_handshake_failures_total{{{SEL}}}[{W}]))",
                        "router handshake {{reason}}",
                    ),
                ),
                unit="ops",
                description="Failed transfers: a decode could not pull a prefill's KV (the router retries or falls "
                "back); expired KV: a prefill's blocks were not pulled within kv_lease_duration.",
            ),
            Panel(
                "Prefill/decode pairs by rack locality (router)",
                (Query(f"sum by (locality) (rate({ROUTER}pairs_total{{{SEL}}}[{W}]))", "{{locality}}"),),
                unit="reqps",
            ),
        ),
    )


def all_dashboards() -> tuple[Dashboard, ...]:
    """Every dashboard, in display order."""
    return (fleet_overview(), sla(), autoscaler(), router(), kv_transfer())


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "includeAll": False,
        "multi": False,
    }


def _panel_json(panel: Panel, index: int) -> dict[str, Any]:
    grid = {
        "h": PANEL_HEIGHT,
        "w": PANEL_WIDTH,
        "x": (index % COLUMNS) * PANEL_WIDTH,
        "y": (index // COLUMNS) * PANEL_HEIGHT,
    }
    return {
        "id": index + 1,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "gridPos": grid,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": q.expr, "legendFormat": q.legend, "range": True}
            for i, q in enumerate(panel.queries)
        ],
    }


def dashboard_json(dashboard: Dashboard) -> dict[str, Any]:
    """Grafana dashboard JSON model of `dashboard`."""
    fleet_series = engine_series("running_gauge", "", ENGINE_POOLS)
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": ["pdfleet"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"},
                _variable("namespace", "Namespace", f"label_values({fleet_series}, namespace)"),
                _variable("pdd", "PDDeployment", f'label_values({fleet_series[:-1]}, namespace="$namespace"}}, pdd)'),
            ]
        },
        "panels": [_panel_json(panel, i) for i, panel in enumerate(dashboard.panels)],
    }


def dashboard_files() -> dict[str, str]:
    """File name -> JSON text of every dashboard (what charts/pdfleet/dashboards/ must hold)."""
    return {f"{d.uid}.json": json.dumps(dashboard_json(d), indent=2, sort_keys=True) + "\n" for d in all_dashboards()}


def panel_queries() -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, PromQL) of every panel target."""
    return [(d.uid, p.title, q.expr) for d in all_dashboards() for p in d.panels for q in p.queries]
