"""Prometheus alert rules generated from code: SLA breaches, missing metrics, pools pinned at max, stuck drains,
unattainable latency targets.

`rule_groups()` is the `groups:` list of a Prometheus rules file (and of a PrometheusRule's spec);
`scripts/render_manifests.py` writes it to charts/pdfleet/files/alert-rules.yaml for the chart's PrometheusRule.
Each alert keeps its condition apart from its threshold (`Alert.signal`, `Alert.comparison`) so the integration test
can check that the signal itself returns data in a real Prometheus, not only that the whole rule parses.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from pdfleet.chart.queries import ENGINE_POOLS, engine_quantile, engine_series
from pdfleet.operator import fleet_metrics as fm

WINDOW = "5m"
FLEET = "namespace, pdd"
POOL = "namespace, pdd, pool"
DRAIN_STUCK_FOR = "15m"  # the autoscaler stops waiting at drainTimeoutSeconds (default 120 s): far past it is stuck


@dataclass(frozen=True)
class Alert:
    """One alerting rule: fires when `signal comparison` returns samples for `for_`."""

    name: str
    signal: str
    comparison: str
    for_: str
    severity: str
    summary: str
    description: str

    @property
    def expr(self) -> str:
        """The full PromQL condition."""
        return f"{self.signal} {self.comparison}"


def _sla_breach(objective: str, field_name: str, pools: tuple[str, ...], what: str) -> Alert:
    """p90 of the first of `pools` with series: `or` keeps the left side wherever it has a sample per fleet."""
    p90 = " or ".join(engine_quantile(0.9, field_name, FLEET, f'pool="{pool}"', WINDOW) for pool in pools)
    if len(pools) > 1:
        p90 = f"({p90})"  # `or` binds looser than the comparison that follows
    return Alert(
        name=f"PDFleet{objective.upper()}SLABreach",
        signal=p90,
        comparison=f'> on ({FLEET}) {fm.SLA_TARGET_SECONDS}{{objective="{objective}"}}',
        for_="10m",
        severity="warning",
        summary=f"{what} p90 above the SLA target",
        description=f"{{{{ $labels.namespace }}}}/{{{{ $labels.pdd }}}}: {what} p90 over {WINDOW} is "
        f"{{{{ $value | humanizeDuration }}}}, above spec.sla.{objective}Ms.",
    )


def alerts() -> tuple[Alert, ...]:
    """Every alert, in rule-file order."""
    engines_up = f"count by ({POOL}) ({engine_series('running_gauge', '', ENGINE_POOLS)})"
    return (
        # a prefill pool at zero has no series: the decodes then compute every prompt, and theirs is the TTFT
        _sla_breach("ttft", "ttft_histogram", ("prefill", "decode"), "TTFT (prefill pool, or decodes without one)"),
        _sla_breach("tpot", "itl_histogram", ("decode",), "TPOT / inter-token latency (decode pool)"),
        Alert(
            name="PDFleetEngineMetricsMissing",
            signal=f'{fm.POOL_REPLICAS}{{state="ready"}}',
            comparison=f"> 0 unless on ({POOL}) {engines_up}",
            for_="5m",
            severity="warning",
            summary="Ready engine pods export no metrics",
            description="{{ $labels.namespace }}/{{ $labels.pdd }} {{ $labels.pool }} has {{ $value }} ready pods but "
            "Prometheus has no engine series for the pool: check the scrape config (PodMonitor) and "
            "relabelling. The autoscaler holds replicas while its signals are missing.",
        ),
        Alert(
            name="PDFleetAutoscalerMetricsUnavailable",
            signal=fm.AUTOSCALER_METRICS_AVAILABLE,
            comparison="== 0",
            for_="5m",
            severity="warning",
            summary="The autoscaler cannot read its signals",
            description="{{ $labels.namespace }}/{{ $labels.pdd }}: the autoscaler holds replicas because its "
            "Prometheus queries fail or return no samples; see the MetricsAvailable condition.",
        ),
        Alert(
            name="PDFleetPoolAtMaxReplicas",
            signal=fm.AUTOSCALER_DESIRED_REPLICAS,
            comparison=f">= on ({POOL}) {fm.AUTOSCALER_MAX_REPLICAS}",
            for_="15m",
            severity="warning",
            summary="Pool pinned at autoscaling.maxReplicas",
            description="{{ $labels.namespace }}/{{ $labels.pdd }} {{ $labels.pool }} wants {{ $value }} replicas, "
            "its maxReplicas: the SLA may be missed; raise maxReplicas or the GPU budget.",
        ),
        Alert(
            name="PDFleetDrainStuck",
            signal=fm.AUTOSCALER_DRAINING,
            comparison="== 1",
            for_=DRAIN_STUCK_FOR,
            severity="warning",
            summary="Scale-down drain not finishing",
            description="{{ $labels.namespace }}/{{ $labels.pdd }} {{ $labels.pool }} has been draining for more than "
            f"{DRAIN_STUCK_FOR}; check the router's /admin/endpoints and the operator log.",
        ),
        Alert(
            name="PDFleetTargetUnattainable",
            signal=fm.AUTOSCALER_TARGET_UNATTAINABLE,
            comparison="== 1",
            for_="10m",
            severity="warning",
            summary="Latency target below the requests' own floor: raise the target or use faster hardware",
            description="{{ $labels.namespace }}/{{ $labels.pdd }} {{ $labels.pool }}: the latency target is below "
            "the latency an idle replica needs for the requests, so adding replicas cannot meet it; raise the "
            "target or use faster hardware. See the SLAAttainable condition.",
        ),
    )


def rule_groups() -> list[dict]:
    """The `groups:` of a Prometheus rules file holding every alert."""
    rules = [
        {
            "alert": a.name,
            "expr": a.expr,
            "for": a.for_,
            "labels": {"severity": a.severity},
            "annotations": {"summary": a.summary, "description": a.description},
        }
        for a in alerts()
    ]
    return [{"name": "pdfleet", "rules": rules}]


def rules_file() -> str:
    """YAML text of a Prometheus rules file (what charts/pdfleet/files/alert-rules.yaml must hold)."""
    return yaml.safe_dump({"groups": rule_groups()}, sort_keys=False, width=120)
