"""Kopf wiring of the autoscaler: one daemon per PDDeployment runs `plan_autoscale` every interval.

The adapter's jobs are I/O only: read Prometheus (`PrometheusSignalSource`), ask every router replica for its endpoint
view during a drain, write `spec.<pool>.replicas` (as HPA writes a Deployment's replicas; the reconcile renders the
cells from it), write `status.autoscaler` / `status.drain`, post Events and export the decisions as metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Mapping

import kopf

from pdfleet import API_GROUP, API_VERSION, PLURAL, POOLS
from pdfleet.api.model import PDDeploymentSpec, SpecError, parse_spec
from pdfleet.autoscale.metrics import (
    CURRENT,
    DECISIONS,
    DESIRED,
    DRAINING,
    METRICS_AVAILABLE,
    SIGNAL,
    TARGET_UNATTAINABLE,
)
from pdfleet.autoscale.policy import PoolScalerState
from pdfleet.autoscale.signals import PrometheusSignalSource
from pdfleet.autoscale.step import AutoscaleStep, plan_autoscale
from pdfleet.cluster.events import post_events
from pdfleet.cluster.indexes import body_snapshot, index_snapshot
from pdfleet.cluster.kube import KubeClient
from pdfleet.cluster.lifetimes import deleted, without_finalizer
from pdfleet.cluster.observed import PodState
from pdfleet.cluster.router_admin import AdminTokens, endpoint_views, router_admin_urls
from pdfleet.topology.inventory import node_info

log = logging.getLogger("pdfleet.autoscaler")

DRAIN_POLL_SECONDS = 2.0  # while draining, look at the routers more often than the interval


def export(namespace: str, name: str, step: AutoscaleStep) -> None:
    for pool, chosen in step.decision.decisions.items():
        labels = (namespace, name, pool)
        DESIRED.labels(*labels).set(chosen.desired)
        CURRENT.labels(*labels).set(chosen.current)
        TARGET_UNATTAINABLE.labels(*labels).set(1 if chosen.unattainable else 0)
        for signal, value in chosen.signals.items():
            SIGNAL.labels(*labels, signal).set(value)
        direction = "up" if chosen.desired > chosen.current else "down" if chosen.desired < chosen.current else "hold"
        DECISIONS.labels(*labels, direction, chosen.driving_signal or "none").inc()
        DRAINING.labels(*labels).set(1 if (step.status["drain"] or {}).get("pool") == pool else 0)
    METRICS_AVAILABLE.labels(namespace, name).set(1 if step.status["autoscaler"]["metrics"]["available"] else 0)


def run_interval(
    kube: KubeClient,
    tokens: AdminTokens,
    source: PrometheusSignalSource,
    body: Mapping[str, Any],
    spec: PDDeploymentSpec,
    nodes: list[dict],
    pods: list[PodState],
    states: dict[str, PoolScalerState],
) -> AutoscaleStep:
    """Fetch, decide, write. Blocking: runs in a worker thread."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    status = body.get("status") or {}
    now = time.time()
    readings = source.fetch(
        spec.engine.kind, namespace, name, spec.autoscaler.window_seconds, spec.sla.percentile, at=now
    )
    views: list[list[dict] | None] = []
    if status.get("drain"):
        urls = router_admin_urls(pods, spec.router.admin_port, ready_only=True).values()
        views = endpoint_views(urls, tokens.token(kube, body))
    step = plan_autoscale(
        spec=spec,
        pdd_name=name,
        status=status,
        nodes=[node_info(n, spec.topology) for n in nodes],
        readings=readings,
        states=states,
        router_views=views,
        now=now,
    )
    if step.replicas:
        kube.patch_custom(
            API_GROUP,
            API_VERSION,
            PLURAL,
            namespace,
            name,
            {"spec": {pool: {"replicas": n} for pool, n in step.replicas.items()}},
        )
    changed = {k: v for k, v in step.status.items() if status.get(k) != v}
    if changed:
        kube.patch_status(API_GROUP, API_VERSION, PLURAL, namespace, name, changed)
    export(namespace, name, step)
    return step


def _autoscaled(spec: PDDeploymentSpec) -> bool:
    return any(spec.pool(pool).autoscaling.enabled for pool in POOLS)


@without_finalizer
@kopf.daemon(API_GROUP, API_VERSION, PLURAL, cancellation_timeout=10)
async def autoscaler_daemon(
    namespace: str,
    name: str,
    body: kopf.Body,
    stopped: kopf.DaemonStopped,
    memo: kopf.Memo,
    node_index: kopf.Index,
    pod_index: kopf.Index,
    **_: Any,
) -> None:
    states: dict[str, PoolScalerState] = {}
    sources: dict[str, PrometheusSignalSource] = {}
    try:
        while not stopped and not deleted(body):
            delay = 15.0
            try:
                spec = parse_spec(dict(body.get("spec") or {}))
                delay = float(spec.autoscaler.interval_seconds)
                if _autoscaled(spec):
                    source = sources.setdefault(spec.prometheus.url, PrometheusSignalSource(spec.prometheus.url))
                    step = await asyncio.to_thread(
                        run_interval,
                        memo.kube,
                        memo.admin_tokens,
                        source,
                        body_snapshot(body),
                        spec,
                        index_snapshot(node_index, None),
                        index_snapshot(pod_index, (namespace, name)),
                        states,
                    )
                    states = step.states
                    post_events(body, step.events)
                    if step.status["drain"]:
                        delay = min(delay, DRAIN_POLL_SECONDS)
                    held = [d for d in step.decision.decisions.values() if d.held]
                    if held:
                        log.info("%s/%s holding: %s", namespace, name, "; ".join(d.reason for d in held))
                else:
                    states = {}
            except SpecError:
                pass  # the reconcile reports an invalid spec; nothing to scale until it is fixed
            except Exception:
                log.exception("autoscaler interval for %s/%s failed", namespace, name)
            await stopped.wait(delay)
    finally:
        for source in sources.values():
            source.close()
