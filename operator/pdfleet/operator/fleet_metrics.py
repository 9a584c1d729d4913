"""Per-PDDeployment gauges computed from the PDDeployment objects (spec + status) the operator already holds, and the
names of the autoscaler's own metrics, so dashboards and alerts have one place to get every operator-side name.

The autoscaler exports its decisions itself (pdfleet.autoscale.metrics: desired replicas, signals, decisions,
metrics availability, drains). What it does not export, dashboards and alerts still need: each fleet's SLA targets,
its replicas by state and its autoscaling bounds. The status and spec already hold them, so one pure function turns
PDDeployment bodies into samples and a prometheus_client collector exposes them at scrape time (no state to keep in
sync). Every series carries `namespace`, `pdd` (and `pool` where it applies): the target labels engine pods are
relabelled to (pdfleet.localfleet.prometheus.engine_pod_relabel_configs), so PromQL joins them
`on (namespace, pdd, pool)`.

Wiring in the operator: `prometheus_client.REGISTRY.register(FleetStateCollector(bodies))` where `bodies()` returns
the current PDDeployment objects (e.g. from a Kopf index on pddeployments).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import metrics as client_metrics
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pdfleet import POOLS
from pdfleet.api.model import PDDeploymentStatus, SpecError, parse_spec
from pdfleet.autoscale import metrics as autoscaler


def _exposed_name(metric: client_metrics.MetricWrapperBase) -> str:
    """The name a prometheus_client metric has on /metrics (counters gain `_total`)."""
    family = metric.describe()[0]
    return family.name + ("_total" if family.type == "counter" else "")


# exported by the autoscaler (labels namespace, pdd, pool)
AUTOSCALER_DESIRED_REPLICAS = _exposed_name(autoscaler.DESIRED)
AUTOSCALER_CURRENT_REPLICAS = _exposed_name(autoscaler.CURRENT)
AUTOSCALER_SIGNAL = _exposed_name(autoscaler.SIGNAL)  # + signal
AUTOSCALER_DECISIONS = _exposed_name(autoscaler.DECISIONS)  # + direction, signal (the driving one)
AUTOSCALER_METRICS_AVAILABLE = _exposed_name(autoscaler.METRICS_AVAILABLE)  # namespace, pdd only
AUTOSCALER_DRAINING = _exposed_name(autoscaler.DRAINING)
AUTOSCALER_TARGET_UNATTAINABLE = _exposed_name(autoscaler.TARGET_UNATTAINABLE)

# exported by FleetStateCollector
POOL_REPLICAS = "pdfleet_pool_replicas"
SLA_TARGET_SECONDS = "pdfleet_sla_target_seconds"
AUTOSCALER_MIN_REPLICAS = "pdfleet_autoscaler_min_replicas"
AUTOSCALER_MAX_REPLICAS = "pdfleet_autoscaler_max_replicas"
AUTOSCALER_LAST_SCALE = "pdfleet_autoscaler_last_scale_timestamp_seconds"

FLEET = ("namespace", "pdd")
POOL = (*FLEET, "pool")

# name -> (help, label names): the collector's whole contract, also what docs/install.md lists
FLEET_METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    POOL_REPLICAS: (
        "Pool replicas by state: spec (asked for), current (pods exist), ready (pods Ready).",
        (*POOL, "state"),
    ),
    SLA_TARGET_SECONDS: ("SLA latency target in seconds, by objective (ttft, tpot).", (*FLEET, "objective")),
    AUTOSCALER_MIN_REPLICAS: ("Autoscaling lower bound of the pool (autoscaled pools only).", POOL),
    AUTOSCALER_MAX_REPLICAS: ("Autoscaling upper bound of the pool (autoscaled pools only).", POOL),
    AUTOSCALER_LAST_SCALE: ("Unix time of the pool's last replica change by the autoscaler.", POOL),
}


@dataclass(frozen=True)
class Sample:
    """One gauge value: metric name, label values in FLEET_METRICS order, value."""

    name: str
    labels: tuple[str, ...]
    value: float


def _unix(rfc3339: str) -> float:
    return datetime.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def fleet_samples(body: Mapping[str, Any]) -> list[Sample]:
    """The gauges of one PDDeployment object (Kubernetes JSON); none when its spec is invalid."""
    meta = body.get("metadata") or {}
    fleet = (meta.get("namespace", ""), meta.get("name", ""))
    try:
        spec = parse_spec(body.get("spec") or {})
    except SpecError:
        return []
    status = PDDeploymentStatus.model_validate(body.get("status") or {})
    samples = [
        Sample(SLA_TARGET_SECONDS, (*fleet, "ttft"), spec.sla.ttft_ms / 1000.0),
        Sample(SLA_TARGET_SECONDS, (*fleet, "tpot"), spec.sla.tpot_ms / 1000.0),
    ]
    for pool in POOLS:
        labels = (*fleet, pool)
        pool_status = getattr(status, pool)
        samples += [
            Sample(POOL_REPLICAS, (*labels, "spec"), spec.pool(pool).replicas),
            Sample(POOL_REPLICAS, (*labels, "current"), pool_status.current_replicas),
            Sample(POOL_REPLICAS, (*labels, "ready"), pool_status.ready_replicas),
        ]
        scaling = spec.pool(pool).autoscaling
        if scaling.enabled:
            samples += [
                Sample(AUTOSCALER_MIN_REPLICAS, labels, scaling.min_replicas),
                Sample(AUTOSCALER_MAX_REPLICAS, labels, scaling.max_replicas),
            ]
        decision = getattr(status.autoscaler, pool) if status.autoscaler is not None else None
        if decision is not None and decision.last_scale_time:
            samples.append(Sample(AUTOSCALER_LAST_SCALE, labels, _unix(decision.last_scale_time)))
    return samples


def metric_families(samples: Iterable[Sample]) -> list[GaugeMetricFamily]:
    """Group samples into one gauge family per contract metric (families without samples are left out)."""
    families: dict[str, GaugeMetricFamily] = {}
    for sample in samples:
        if sample.name not in families:
            doc, label_names = FLEET_METRICS[sample.name]
            families[sample.name] = GaugeMetricFamily(sample.name, doc, labels=label_names)
        families[sample.name].add_metric(list(sample.labels), sample.value)
    return list(families.values())


class FleetStateCollector(Collector):
    """prometheus_client collector: the FLEET_METRICS gauges of the PDDeployments `bodies()` returns at scrape time."""

    def __init__(self, bodies: Callable[[], Iterable[Mapping[str, Any]]]) -> None:
        self.bodies = bodies

    def collect(self) -> Iterator[Metric]:
        """prometheus_client collector protocol."""
        yield from metric_families(s for body in self.bodies() for s in fleet_samples(body))
