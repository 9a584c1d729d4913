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

from pdfleet import API_GROUP, API_VERSION, OPERATOR_IMAGE, PLURAL
from pdfleet.cluster.events import post_events
from pdfleet.cluster.indexes import CHILD_INDEXES, MANAGED, body_snapshot, index_snapshot
from pdfleet.cluster.kube import KubeClient, load_api_client
from pdfleet.cluster.lifetimes import deleted, without_finalizer
from pdfleet.cluster.observed import PodState
from pdfleet.cluster.router_admin import AdminTokens, router_admin_urls, sync_fleet_view
from pdfleet.reconcile.plan import ReconcilePlan, RouterView, plan_reconcile, status_patch
from pdfleet.render.meta import LABEL_INSTANCE
from pdfleet.render.router_access import AdminClients

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
ROUTER_VIEW_REPAIRS = Counter(
    "pdfleet_operator_router_view_repairs_total",
    "Router replicas found running a fleet view the operator did not write, and replaced",
    ["namespace", "pdd"],
)

RESYNC_SECONDS = float(os.environ.get("PDFLEET_RESYNC_SECONDS", "30"))
DEBOUNCE_SECONDS = 0.2  # batch the burst of pod/child events one scale-up causes
PUSH_RETRY_SECONDS = 2.0  # a router that did not take its fleet view (still starting) is tried again this soon

_wakeups: dict[tuple[str, str], asyncio.Event] = {}
# Per PDDeployment: the newest (generation, revision) of fleet view this process pushed, and what the last sync
# found routers running that it did not write (reported as Degraded by the next plan).
_newest_pushed: dict[tuple[str, str], tuple[int, int]] = {}
_view_conflicts: dict[tuple[str, str], str] = {}
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
    memo.operator_image = os.environ.get("PDFLEET_OPERATOR_IMAGE", OPERATOR_IMAGE)
    memo.admin_clients = AdminClients.from_env(os.environ)
    memo.admin_tokens = AdminTokens()
    log.info("PodDisruptionBudget API: %s", memo.kube.api_version_of("PodDisruptionBudget"))


# --- triggers: everything wakes the per-PDDeployment daemon ---------------------------------------------------


@kopf.on.event("pods", labels=MANAGED)
@kopf.on.event("apps", "v1", "statefulsets", labels=MANAGED)
@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
@kopf.on.event("v1", "services", labels=MANAGED)
@kopf.on.event("v1", "configmaps", labels=MANAGED)
@kopf.on.event("policy", "poddisruptionbudgets", labels=MANAGED)
@kopf.on.event("networking.k8s.io", "v1", "networkpolicies", labels=MANAGED)
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


def push_to_routers(
    kube: KubeClient, tokens: AdminTokens, pdd: dict[str, Any], router_view: RouterView, pods: list[PodState]
) -> bool:
    """Bring every running router to the fleet view: read each one's view back and PUT it where it differs (after a
    change, to a router that started or missed a push since: its file may be a sync period old), replacing a view the
    operator did not write (recorded for the next plan's Degraded condition, counted, logged). Returns False when a
    router is not in sync (not listening yet, unreachable, or just repaired): the caller reconciles again soon."""
    key = (pdd["metadata"]["namespace"], pdd["metadata"]["name"])
    view = router_view.view
    routers = router_admin_urls(pods, router_view.admin_port, ready_only=False)
    if not routers:
        return True
    desired = (int(view["generation"]), int(view["revision"]))
    newest = max(_newest_pushed.get(key, desired), desired)
    result = sync_fleet_view(routers, view, tokens.token(kube, pdd), newest)
    _newest_pushed[key] = newest
    if result.unauthorized:
        tokens.forget(pdd)  # the Secret was replaced: read it again
    ready = {pod.name for pod in pods if pod.ready}
    for failure in result.failures:  # a starting router is not listening yet; a Ready one should be
        level = logging.WARNING if failure.split(":", 1)[0] in ready else logging.DEBUG
        log.log(level, "fleet view revision %d not synced to router %s", desired[1], failure)
    if result.repaired:
        ROUTER_VIEW_REPAIRS.labels(*key).inc(len(result.repaired))
        _view_conflicts[key] = (
            f"router {', '.join(sorted(result.repaired))} ran a fleet view the operator did not write (newer than"
            f" its revision {desired[1]}); replaced with the operator's view"
        )
        log.warning("%s/%s: %s", *key, _view_conflicts[key])
    elif not result.failures:
        _view_conflicts.pop(key, None)  # every router runs the operator's view: the next plan clears Degraded
    FLEET_PUSHES.labels("ok").inc(len(result.in_sync))
    FLEET_PUSHES.labels("failed").inc(len(result.failures))
    return not result.failures and not result.repaired


def _forget(key: tuple[str, str], wakeup: asyncio.Event) -> None:
    """Drop a deleted PDDeployment's loop state (children carry owner references: the garbage collector removes them),
    unless a new object of the same name already took its place."""
    if _wakeups.get(key) is wakeup:
        del _wakeups[key]
        FLEETS.pop(key, None)
        _newest_pushed.pop(key, None)
        _view_conflicts.pop(key, None)


@without_finalizer
@kopf.daemon(API_GROUP, API_VERSION, PLURAL, cancellation_timeout=10)
async def reconcile_daemon(
    namespace: str, name: str, body: kopf.Body, stopped: kopf.DaemonStopped, memo: kopf.Memo, **kwargs: Any
) -> None:
    wakeup = _wakeups[(namespace, name)] = asyncio.Event()
    wakeup.set()
    next_resync = 0.0
    while not stopped and not deleted(body):
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
        if deleted(snapshot):
            break  # the garbage collector is removing the children: re-applying them would race it
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
                admin_clients=memo.admin_clients,
                router_view_conflict=_view_conflicts.get(key),
            )
            writes = await asyncio.to_thread(execute_plan, memo.kube, snapshot, plan)
            RECONCILE_WRITES.labels(namespace, name).inc(writes)
            pods = index_snapshot(kwargs["pod_index"], key)
            if plan.router_view is not None and not await asyncio.to_thread(
                push_to_routers, memo.kube, memo.admin_tokens, snapshot, plan.router_view, pods
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
    if deleted(body):
        _forget((namespace, name), wakeup)
