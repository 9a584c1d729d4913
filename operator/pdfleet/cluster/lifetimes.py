"""PDDeployments carry no finalizer, so their daemons stop themselves when the object is deleted.

Children are owned through ownerReferences (the garbage collector removes them), so nothing has to run before a
PDDeployment goes; and an uninstall deletes the CRD together with the operator, so a finalizer would wait forever for
an operator that is gone. Kopf, though, puts a finalizer on every object a daemon serves (it stops daemons on the
deletion that the finalizer holds back) and has no setting against it: `without_finalizer` clears that need, and each
daemon ends its loop once `deleted` says so: the DELETED watch event, a deletionTimestamp (foreground deletion), or the
CRD's own deletion (Kopf stops watching a resource whose CRD goes, possibly before the objects' DELETED events arrive).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import kopf

from pdfleet import API_GROUP, API_VERSION, PLURAL

CRD_NAME = f"{PLURAL}.{API_GROUP}"

FORGET_AFTER_SECONDS = 600.0  # a daemon notices its deletion within seconds; remember it this long

_deleted: dict[str, float] = {}  # uid -> monotonic time its DELETED event arrived
_live: set[str] = set()  # uids of the PDDeployments seen and not deleted

DaemonFn = TypeVar("DaemonFn", bound=Callable[..., Any])


def without_finalizer(fn: DaemonFn) -> DaemonFn:
    """Register the Kopf daemon `fn` (decorated with `kopf.daemon` below this) as needing no finalizer; `fn` must end
    its loop once `deleted(body)`. Kopf has no option for this, so its handler record is replaced in the registry."""
    spawning = kopf.get_default_registry()._spawning
    spawning._handlers = [
        dataclasses.replace(handler, requires_finalizer=False) if handler.fn is fn else handler
        for handler in spawning._handlers
    ]
    return fn


def mark_deleted(uid: str, now: float | None = None) -> None:
    """Remember that the PDDeployment `uid` is gone (forgetting deletions older than FORGET_AFTER_SECONDS)."""
    now = time.monotonic() if now is None else now
    for old in [key for key, at in _deleted.items() if now - at > FORGET_AFTER_SECONDS]:
        del _deleted[old]
    _deleted[uid] = now


def deleted(body: Mapping[str, Any]) -> bool:
    """Whether the PDDeployment `body` was deleted or is being deleted: its daemons should end."""
    metadata = body.get("metadata") or {}
    return bool(metadata.get("deletionTimestamp")) or metadata.get("uid") in _deleted


@kopf.on.event(API_GROUP, API_VERSION, PLURAL)
def pddeployment_event(event: Mapping[str, Any], uid: str, **_: Any) -> None:
    if event.get("type") == "DELETED":
        _live.discard(uid)
        mark_deleted(uid)
    else:
        _live.add(uid)


@kopf.on.event("apiextensions.k8s.io", "v1", "customresourcedefinitions")
def crd_event(event: Mapping[str, Any], name: str, meta: Mapping[str, Any], **_: Any) -> None:
    if name == CRD_NAME and (event.get("type") == "DELETED" or meta.get("deletionTimestamp")):
        for uid in list(_live):  # deleting the CRD deletes every PDDeployment
            _live.discard(uid)
            mark_deleted(uid)
