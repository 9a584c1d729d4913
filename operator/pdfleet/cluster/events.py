"""Kubernetes Events on a PDDeployment: the one type both controllers emit, and the one poster that counts them.

Events are API writes, so the controllers decide purely which to emit (only on transitions) and this adapter posts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import kopf
from prometheus_client import Counter

EVENTS = Counter("pdfleet_operator_events_total", "Kubernetes Events posted by the operator", ["type", "reason"])


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the PDDeployment (reconcile and autoscaler alike)."""

    type: str  # Normal | Warning
    reason: str
    message: str


def post_events(body: kopf.Body, events: Iterable[Event]) -> None:
    """Post Events on the PDDeployment through Kopf's poster, counting them."""
    for event in events:
        EVENTS.labels(event.type, event.reason).inc()
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
