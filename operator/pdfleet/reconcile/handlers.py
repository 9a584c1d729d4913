"""Kopf wiring: indexes of what runs, and one level-triggered reconcile loop per PDDeployment.

Every trigger (create/update/resume of a PDDeployment, any change of its pods or children, any Node change) only
wakes the PDDeployment's reconcile daemon; the daemon computes the whole desired state from the Kopf indexes with the
pure `plan_reconcile` and writes only what differs. So the same code path serves every event, and a reconcile of an
unchanged fleet makes zero API writes.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import time
from typing import Any

import kopf
from prometheus_client import Counter, Histogram

from pdfleet import API_GROUP, API_VERSION, PLURAL
from pdfleet.cluster.events import post_events
from pdfleet.cluster.indexes import CHILD_INDEXES, MANAGED, body_snapshot, index_snapshot
from pdfleet.cluster.kube import KubeClient, load_api_client
from pdfleet.cluster.observed import PodState
from pdfleet.cluster.router_admin import push_fleet_view, router_admin_urls
from pdfleet.reconcile.plan import ReconcilePlan, RouterView, plan_reconcile, status_patch
from pdfleet.render.meta import LABEL_INSTANCE

log = logging.getLogger("pdfleet.operator")

RECONCILES = Counter("pdfleet_operator_reconciles_total", "Reconciles run", ["result"])
RECONCILE_SECONDS = Histogram(
    "pdfleet_operator_reconcile_duration_seconds",
    "Wall time of one reconcile",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RECONCILE_WRITES = Counter(
    "pdfleet_operator_reconcile_writes_total",
    "API writes made by reconciles (applies, deletes, status patches)",
    ["namespace", "pdd"],
)
FLEET_PUSHES = Counter(
    "pdfleet_operator_fleet_view_pushes_total",
    "Fleet views PUT to router replicas (failed: the router reads the ConfigMap file later)",
    ["result"],
)

RESYNC_SECONDS = float(os.environ.get("PDFLEET_RESYNC_SECONDS", "30"))
DEBOUNCE_SECONDS = 0.2  # batch the burst of pod/child events one scale-up causes
PUSH_RETRY_SECONDS = 2.0  # a router that did not take its fleet view (still starting) is tried again this soon

_wakeups: dict[tuple[str, str], asyncio.Event] = {}
# Per PDDeployment: the fleet-view revision last pushed and the router pods that hold it.
_router_pushes: dict[tuple[str, str], tuple[int, frozenset[str]]] = {}
# The last body each reconcile saw, for the fleet-state metrics collector (pdfleet.operator.fleet_metrics).
FLEETS: dict[tuple[str, str], dict[str, Any]] = {}


def _wake(namespace: str | None, name: str | None) -> None:
    event = _wakeups.get((namespace or "", name or ""))
    if event is not None:
        event.set()


def _wake_all() -> None:
    for event in _wakeups.values():
        event.set()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.loggers = False  # events are writes: post only the ones we mean (condition transitions)
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=API_GROUP)
    settings.persistence.finalizer = f"{API_GROUP}/finalizer"
    settings.watching.server_timeout = 300
    memo.kube = KubeClient(load_api_client())
    memo.kube.discover_versions()
    memo.operator_image = os.environ.get("PDFLEET_OPERATOR_IMAGE", "ghcr.io/pdfleet/pdfleet:0.1.0")
    log.info("PodDisruptionBudget API: %s", memo.kube.api_version_of("PodDisruptionBudget"))


# --- triggers: everything wakes the per-PDDeployment daemon ---------------------------------------------------


@kopf.on.event("pods", labels=MANAGED)
@kopf.on.event("apps", "v1", "statefulsets", labels=MANAGED)
@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
@kopf.on.event("v1", "services", labels=MANAGED)
@kopf.on.event("v1", "configmaps", labels=MANAGED)
@kopf.on.event("policy", "poddisruptionbudgets", labels=MANAGED)
def child_changed(namespace: str, labels: kopf.Labels, **_: Any) -> None:
    _wake(namespace, labels.get(LABEL_INSTANCE))


@kopf.on.event("nodes")
def node_changed(**_: Any) -> None:
    _wake_all()


@kopf.on.create(API_GROUP, API_VERSION, PLURAL)
@kopf.on.update(API_GROUP, API_VERSION, PLURAL)
@kopf.on.resume(API_GROUP, API_VERSION, PLURAL)
def pddeployment_changed(namespace: str, name: str, **_: Any) -> None:
    _wake(namespace, name)


@kopf.on.delete(API_GROUP, API_VERSION, PLURAL, optional=True)
def pddeployment_deleted(namespace: str, name: str, **_: Any) -> None:
    # Children carry owner references: the garbage collector removes them; nothing to do but forget the loop.
    _wakeups.pop((namespace, name), None)
    FLEETS.pop((namespace, name), None)
    _router_pushes.pop((namespace, name), None)


# --- the reconcile loop ----------------------------------------------------------------------------------------


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def execute_plan(kube: KubeClient, body: dict, plan: ReconcilePlan) -> int:
    """Carry out a plan's writes; returns how many API writes it made."""
    meta = body["metadata"]
    writes = 0
    for obj in plan.applies:
        kube.apply(obj)
        writes += 1
    for kind, name in plan.deletes:
        kube.delete(kind, meta["namespace"], name)
        writes += 1
    patch = status_patch(body.get("status") or {}, plan.status)
    if patch:
        kube.patch_status(API_GROUP, API_VERSION, PLURAL, meta["namespace"], meta["name"], patch)
        writes += 1
    return writes


def push_to_routers(key: tuple[str, str], router_view: RouterView, pods: list[PodState]) -> bool:
    """PUT the fleet view to each running router that has not taken this revision yet: after a change, and to a
    router that started or missed a push since (its file may be a sync period old). Returns False when a router did
    not take it (not listening yet, or unreachable): the caller retries soon; the ConfigMap file reaches it anyway."""
    revision = router_view.view["revision"]
    pushed_revision, taken = _router_pushes.get(key, (0, frozenset()))
    if pushed_revision != revision:
        taken = frozenset()
    routers = {
        name: url
        for name, url in router_admin_urls(pods, router_view.admin_port, ready_only=False).items()
        if name not in taken
    }
    if not routers:
        return True
    newly, failures = push_fleet_view(routers, router_view.view)
    _router_pushes[key] = (revision, taken | frozenset(newly))
    ready = {pod.name for pod in pods if pod.ready}
    for failure in failures:  # a starting router is not listening yet; a Ready one should be
        level = logging.WARNING if failure.split(":", 1)[0] in ready else logging.DEBUG
        log.log(level, "fleet view revision %d not pushed to router %s", revision, failure)
    FLEET_PUSHES.labels("ok").inc(len(newly))
    FLEET_PUSHES.labels("failed").inc(len(failures))
    return not failures


@kopf.daemon(API_GROUP, API_VERSION, PLURAL, cancellation_timeout=10)
async def reconcile_daemon(
    namespace: str, name: str, body: kopf.Body, stopped: kopf.DaemonStopped, memo: kopf.Memo, **kwargs: Any
) -> None:
    wakeup = _wakeups.setdefault((namespace, name), asyncio.Event())
    wakeup.set()
    next_resync = 0.0
    while not stopped:
        try:
            await asyncio.wait_for(wakeup.wait(), timeout=1.0)  # short, so a stop is noticed within a second
        except asyncio.TimeoutError:
            if time.monotonic() < next_resync:
                continue
        await asyncio.sleep(DEBOUNCE_SECONDS)
        wakeup.clear()
        next_resync = time.monotonic() + RESYNC_SECONDS
        key = (namespace, name)
        snapshot = body_snapshot(body)
        if snapshot["metadata"].get("deletionTimestamp"):
            continue  # the garbage collector is removing the children: re-applying them would race it
        FLEETS[key] = snapshot
        started = time.perf_counter()
        try:
            # Placement and rendering are pure but not free: plan in a worker thread, never on the event loop.
            plan = await asyncio.to_thread(
                plan_reconcile,
                pdd=snapshot,
                nodes=index_snapshot(kwargs["node_index"], None),
                children=[c for idx in CHILD_INDEXES for c in index_snapshot(kwargs[idx], key)],
                pods=index_snapshot(kwargs["pod_index"], key),
                pdb_api_version=memo.kube.api_version_of("PodDisruptionBudget"),
                operator_image=memo.operator_image,
                now=_now(),
            )
            writes = await asyncio.to_thread(execute_plan, memo.kube, snapshot, plan)
            RECONCILE_WRITES.labels(namespace, name).inc(writes)
            if plan.router_view is not None and not await asyncio.to_thread(
                push_to_routers, key, plan.router_view, index_snapshot(kwargs["pod_index"], key)
            ):
                next_resync = time.monotonic() + PUSH_RETRY_SECONDS
            post_events(body, plan.events)
            RECONCILES.labels("ok").inc()
        except Exception as exc:
            RECONCILES.labels("error").inc()
            log.exception("reconcile of %s/%s failed", namespace, name)
            kopf.event(body, type="Warning", reason="ReconcileError", message=str(exc)[:1000])
            next_resync = time.monotonic() + 5
        finally:
            RECONCILE_SECONDS.observe(time.perf_counter() - started)
