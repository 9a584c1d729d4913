"""Pure checks of the generated observability: fleet-state gauges, dashboards, alert rules and the derived RBAC."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from pdfleet.chart import alerts, dashboards, rbac
from pdfleet.operator import fleet_metrics as fm
from pdfleet.router.metrics import LightHistogram

BODY = {
    "metadata": {"namespace": "ml", "name": "chat"},
    "spec": {
        "model": {"name": "m"},
        "prefill": {"replicas": 3, "autoscaling": {"enabled": True, "maxReplicas": 3}},
        "decode": {"replicas": 2},
        "sla": {"ttftMs": 400, "tpotMs": 40},
    },
    "status": {
        "prefill": {"desiredReplicas": 3, "currentReplicas": 3, "readyReplicas": 2},
        "decode": {"desiredReplicas": 2, "currentReplicas": 2, "readyReplicas": 2},
        "autoscaler": {
            "metrics": {"available": False, "reason": "PrometheusDown"},
            "prefill": {
                "desiredReplicas": 3,
                "drivingSignal": "ttft_p",
                "signals": {"ttft_p": 0.8},
                "lastScaleTime": "2026-01-01T00:00:00Z",
            },
        },
        "drain": {
            "pool": "decode",
            "targetReplicas": 1,
            "endpoints": ["chat-decode-rack-a-1"],
            "startedAt": "2026-01-01T00:01:00Z",
        },
    },
}


def samples() -> dict[tuple[str, tuple[str, ...]], float]:
    return {(s.name, s.labels): s.value for s in fm.fleet_samples(BODY)}


def test_fleet_samples_carry_sla_targets_in_seconds_and_replicas_by_state() -> None:
    got = samples()
    assert got[(fm.SLA_TARGET_SECONDS, ("ml", "chat", "ttft"))] == pytest.approx(0.4)
    assert got[(fm.SLA_TARGET_SECONDS, ("ml", "chat", "tpot"))] == pytest.approx(0.04)
    assert got[(fm.POOL_REPLICAS, ("ml", "chat", "prefill", "spec"))] == 3
    assert got[(fm.POOL_REPLICAS, ("ml", "chat", "prefill", "ready"))] == 2


def test_fleet_samples_expose_bounds_of_autoscaled_pools_and_last_scale_time() -> None:
    got = samples()
    assert got[(fm.AUTOSCALER_MAX_REPLICAS, ("ml", "chat", "prefill"))] == 3
    assert got[(fm.AUTOSCALER_MIN_REPLICAS, ("ml", "chat", "prefill"))] == 0  # the prefill default
    assert (fm.AUTOSCALER_MAX_REPLICAS, ("ml", "chat", "decode")) not in got
    assert got[(fm.AUTOSCALER_LAST_SCALE, ("ml", "chat", "prefill"))] == 1767225600


def test_collector_names_never_clash_with_the_autoscalers_own_metrics() -> None:
    exported_by_autoscaler = {
        fm.AUTOSCALER_DESIRED_REPLICAS,
        fm.AUTOSCALER_CURRENT_REPLICAS,
        fm.AUTOSCALER_SIGNAL,
        fm.AUTOSCALER_DECISIONS,
        fm.AUTOSCALER_METRICS_AVAILABLE,
        fm.AUTOSCALER_DRAINING,
    }
    assert not exported_by_autoscaler & set(fm.FLEET_METRICS)
    assert fm.AUTOSCALER_DESIRED_REPLICAS == "pdfleet_autoscaler_desired_replicas"


def test_invalid_spec_yields_no_samples_and_a_fresh_object_only_targets_and_replicas() -> None:
    assert fm.fleet_samples({"metadata": {"name": "x"}, "spec": {"bogus": 1}}) == []
    fresh_body = {"metadata": {"namespace": "a", "name": "b"}, "spec": {"model": {"name": "m"}}}
    fresh = {s.name for s in fm.fleet_samples(fresh_body)}
    assert fresh == {fm.SLA_TARGET_SECONDS, fm.POOL_REPLICAS}


def test_collector_exposes_the_contract_names_in_the_text_format() -> None:
    registry = CollectorRegistry()
    registry.register(fm.FleetStateCollector(lambda: [BODY]))
    text = generate_latest(registry).decode()
    assert 'pdfleet_sla_target_seconds{namespace="ml",objective="ttft",pdd="chat"} 0.4' in text
    assert "# TYPE pdfleet_autoscaler_max_replicas gauge" in text


def test_every_panel_has_queries_units_and_a_non_overlapping_place() -> None:
    for board in dashboards.all_dashboards():
        model = dashboards.dashboard_json(board)
        cells = [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in model["panels"]]
        assert len(set(cells)) == len(cells)
        assert all(p["targets"] and all(t["expr"] for t in p["targets"]) for p in model["panels"])
        assert [v["name"] for v in model["templating"]["list"]] == ["datasource", "namespace", "pdd"]


def test_every_dashboard_query_selects_one_pddeployment() -> None:
    for uid, title, expr in dashboards.panel_queries():
        assert 'namespace="$namespace", pdd="$pdd"' in expr, (uid, title)


def test_required_dashboards_and_alerts_exist() -> None:
    assert [d.uid for d in dashboards.all_dashboards()] == [
        "pdfleet-fleet",
        "pdfleet-sla",
        "pdfleet-autoscaler",
        "pdfleet-router",
        "pdfleet-kv-transfer",
    ]
    assert {a.name for a in alerts.alerts()} == {
        "PDFleetTTFTSLABreach",
        "PDFleetTPOTSLABreach",
        "PDFleetEngineMetricsMissing",
        "PDFleetAutoscalerMetricsUnavailable",
        "PDFleetPoolAtMaxReplicas",
        "PDFleetDrainStuck",
        "PDFleetTargetUnattainable",
    }


def concrete(expr: str) -> str:
    """A dashboard query with Grafana's variables replaced, as Grafana sends it."""
    for variable, value in (
        ("$__rate_interval", "1m"),
        ("$__range", "1h"),
        ("$__interval", "15s"),
        ("$namespace", "ml"),
        ("$pdd", "chat"),
    ):
        expr = expr.replace(variable, value)
    return expr


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed (Debian package prometheus)")
    rules = [
        {"record": f"pdfleet:check:{i}", "expr": concrete(expr)}
        for i, (_, _, expr) in enumerate(dashboards.panel_queries())
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def chart_queries() -> list[str]:
    return [expr for _, _, expr in dashboards.panel_queries()] + [alert.expr for alert in alerts.alerts()]


def test_dashboards_and_alerts_match_engine_names_as_the_autoscaler_does() -> None:
    for expr in chart_queries():
        assert "pdfleet_engine_" not in expr  # the emulator's own series: real vLLM does not export them
        assert not re.search(r"\b(vllm|sglang):", expr), expr  # promql.series spells every name `vllm[:_]x`
    assert any("vllm[:_]nixl_xfer_time_seconds_bucket" in expr for expr in chart_queries())


def attainment_test(target_s: float) -> dict:
    """A promtool unit test: 12 requests a minute through the router (3 at 0.1 s, 3 at 0.45 s, 6 at 0.9 s TTFT)."""
    histogram = LightHistogram()
    for seconds in (0.1,) * 3 + (0.45,) * 3 + (0.9,) * 6:
        histogram.observe(seconds)
    fleet = 'namespace="ml", pdd="chat"'
    per_step = {le: count / 4 for le, count in histogram.cumulative()}  # a quarter each 15 s step
    series = [
        {"series": f'pdfleet_router_ttft_seconds_bucket{{{fleet}, le="{le}"}}', "values": f"0+{step:g}x8"}
        for le, step in per_step.items()
    ]
    series += [
        {"series": f"pdfleet_router_ttft_seconds_count{{{fleet}}}", "values": f"0+{per_step['+Inf']:g}x8"},
        {"series": f'{fm.SLA_TARGET_SECONDS}{{{fleet}, objective="ttft"}}', "values": f"{target_s}x8"},
    ]
    (query,) = [q for _, title, q in dashboards.panel_queries() if title == "SLA attainment" and "ttft" in q]
    return {
        "interval": "15s",
        "input_series": series,
        "promql_expr_test": [{"expr": concrete(query), "eval_time": "2m"}],
    }


@pytest.mark.parametrize(
    ("target_s", "share"),
    [(0.5, 0.5), (0.6, 0.5), (0.45, 0.25), (1.0, 1.0), (0.0005, 0.0)],
    ids=["at-a-boundary", "between-boundaries", "below-the-middle", "all", "below-every-boundary"],
)
def test_sla_attainment_is_the_share_of_requests_within_the_target(
    tmp_path: Path, target_s: float, share: float
) -> None:
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed (Debian package prometheus)")
    test = attainment_test(target_s)
    test["promql_expr_test"][0]["exp_samples"] = [{"labels": "{}", "value": share}]
    path = tmp_path / "attainment-test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "15s", "tests": [test]}))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rbac_rules_follow_the_code_paths() -> None:
    rules = {(r["apiGroups"][0], r["resources"][0]): r["verbs"] for r in rbac.operator_rules()}
    # Kopf list/watch, server-side apply (patch, and create when the object is new), delete
    assert rules[("apps", "statefulsets")] == ["create", "delete", "list", "patch", "watch"]
    assert rules[("", "nodes")] == ["list", "watch"]  # read only
    assert rules[("pdfleet.dev", "pddeployments/status")] == ["patch"]
    assert rules[("", "events")] == ["create"]
    assert not any(("*" in r["verbs"] or "*" in r["resources"]) for r in rbac.operator_rules())
    assert rules[("", "secrets")] == ["create", "get"]  # the routers' admin token Secrets: no list, patch, delete


def test_kube_client_scan_reads_verbs_from_the_http_calls() -> None:
    import ast
    import inspect

    from pdfleet.cluster import kube

    tree = ast.parse(inspect.getsource(kube.KubeClient))
    methods = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert rbac.http_calls(methods["apply"]) == [("patch", "children"), ("create", "children")]
    assert rbac.http_calls(methods["patch_custom"]) == [("patch", "custom/{subresource}")]
    assert rbac.http_calls(methods["discover_versions"]) == [("list", "discovery")]
    assert rbac.http_calls(methods["read_secret"]) == [("get", "secrets")]  # one named object: get, not list
    assert rbac.http_calls(methods["create_secret"]) == [("create", "secrets")]


def test_alert_signals_are_the_left_side_of_their_expressions() -> None:
    for alert in alerts.alerts():
        assert alert.expr.startswith(alert.signal)
        assert re.search(r"^\d+[smh]$", alert.for_)


def test_dashboards_show_requests_over_their_floor_and_the_unattainable_gauge() -> None:
    (panel,) = [p for p in dashboards.autoscaler().panels if "latency floor" in p.title]
    exprs = [q.expr for q in panel.queries]
    assert 'signal="unattainable_requests_ratio"' in exprs[0]
    assert exprs[1].startswith("pdfleet_autoscaler_target_unattainable{")
    assert panel.unit == "percentunit"


@pytest.mark.parametrize(
    ("values", "firing"),
    [("1x20", True), ("0x20", False), ("1x5 0x15", False)],
    ids=["unattainable-for-10m", "attainable", "unattainable-for-5m"],
)
def test_target_unattainable_alert_fires_after_ten_minutes(tmp_path: Path, values: str, firing: bool) -> None:
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed (Debian package prometheus)")
    (alert,) = [a for a in alerts.alerts() if a.name == "PDFleetTargetUnattainable"]
    labels = {"namespace": "ml", "pdd": "chat", "pool": "prefill"}
    selector = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    rules = tmp_path / "alert-rules.yaml"
    rules.write_text(alerts.rules_file())
    expected = {
        "exp_labels": {**labels, "severity": "warning"},
        "exp_annotations": {
            "summary": alert.summary,
            "description": alert.description.replace("{{ $labels.namespace }}", "ml")
            .replace("{{ $labels.pdd }}", "chat")
            .replace("{{ $labels.pool }}", "prefill"),
        },
    }
    test = {
        "interval": "1m",
        "input_series": [{"series": f"{alert.signal}{{{selector}}}", "values": values}],
        "alert_rule_test": [
            {"eval_time": "9m", "alertname": alert.name, "exp_alerts": []},  # pending, not firing yet
            {"eval_time": "12m", "alertname": alert.name, "exp_alerts": [expected] if firing else []},
        ],
    }
    path = tmp_path / "alert-test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [test]}))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def ttft_breach_test(pools: dict[str, float]) -> dict:
    """A promtool unit test of PDFleetTTFTSLABreach: every request of each pool in `pools` takes that many seconds."""
    (alert,) = [a for a in alerts.alerts() if a.name == "PDFleetTTFTSLABreach"]
    fleet = 'namespace="ml", pdd="chat"'
    series = [{"series": f'{fm.SLA_TARGET_SECONDS}{{{fleet}, objective="ttft"}}', "values": "0.5x30"}]
    for pool, seconds in pools.items():
        for le in ("0.25", "1", "+Inf"):
            per_minute = 60 if float(le) >= seconds else 0
            series.append(
                {
                    "series": f'vllm:time_to_first_token_seconds_bucket{{{fleet}, pool="{pool}", le="{le}"}}',
                    "values": f"0+{per_minute}x30",
                }
            )
    return {
        "interval": "1m",
        "input_series": series,
        "alert_rule_test": [{"eval_time": "20m", "alertname": alert.name}],
    }


@pytest.mark.parametrize(
    ("pools", "firing"),
    [({"prefill": 0.1, "decode": 0.9}, False), ({"decode": 0.9}, True), ({"decode": 0.1}, False)],
    ids=["prefill-pool-decides", "prefill-at-zero-slow-decodes", "prefill-at-zero-fast-decodes"],
)
def test_ttft_alert_reads_the_decodes_when_the_prefill_pool_is_at_zero(
    tmp_path: Path, pools: dict[str, float], firing: bool
) -> None:
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed (Debian package prometheus)")
    rules = tmp_path / "alert-rules.yaml"
    rules.write_text(alerts.rules_file())
    test = ttft_breach_test(pools)
    (alert,) = [a for a in alerts.alerts() if a.name == "PDFleetTTFTSLABreach"]
    description = alert.description.replace("{{ $labels.namespace }}", "ml").replace("{{ $labels.pdd }}", "chat")
    expected = {
        "exp_labels": {"namespace": "ml", "pdd": "chat", "severity": "warning"},
        "exp_annotations": {
            "summary": alert.summary,
            "description": description.replace("{{ $value | humanizeDuration }}", "925ms"),
        },
    }
    fired = [expected] if firing else []
    test["alert_rule_test"][0]["exp_alerts"] = fired
    path = tmp_path / "alert-test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [test]}))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
