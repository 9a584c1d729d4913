"""PDDeployments carry no finalizer (uninstall must not wait for an operator that is gone); daemons end on deletion."""

from __future__ import annotations

import kopf

import pdfleet.autoscale.handlers
import pdfleet.reconcile.handlers
from pdfleet.cluster import lifetimes


def test_no_handler_of_the_operator_puts_a_finalizer_on_pddeployments() -> None:
    registry = kopf.get_default_registry()
    daemons = {h.fn for h in registry._spawning.get_all_handlers()}
    assert {pdfleet.reconcile.handlers.reconcile_daemon, pdfleet.autoscale.handlers.autoscaler_daemon} <= daemons
    handlers = [*registry._spawning.get_all_handlers(), *registry._changing.get_all_handlers()]
    assert [h.id for h in handlers if h.requires_finalizer] == []


def test_deleted_objects_are_known_by_uid_or_deletion_timestamp_and_forgotten_later() -> None:
    assert not lifetimes.deleted({"metadata": {"uid": "u-live"}})
    assert lifetimes.deleted({"metadata": {"uid": "u-fg", "deletionTimestamp": "2026-01-01T00:00:00Z"}})
    lifetimes.pddeployment_event(event={"type": "DELETED"}, uid="u-gone")
    lifetimes.pddeployment_event(event={"type": "MODIFIED"}, uid="u-live")
    assert lifetimes.deleted({"metadata": {"uid": "u-gone"}})
    assert not lifetimes.deleted({"metadata": {"uid": "u-live"}})
    lifetimes.mark_deleted("u-later", now=lifetimes.time.monotonic() + lifetimes.FORGET_AFTER_SECONDS + 1)
    assert not lifetimes.deleted({"metadata": {"uid": "u-gone"}})


def test_deleting_the_crd_ends_every_daemon_of_its_objects() -> None:
    lifetimes.pddeployment_event(event={"type": "ADDED"}, uid="u-a")
    lifetimes.crd_event(event={"type": "MODIFIED"}, name="other.example.com", meta={"deletionTimestamp": "t"})
    assert not lifetimes.deleted({"metadata": {"uid": "u-a"}})
    lifetimes.crd_event(event={"type": "MODIFIED"}, name=lifetimes.CRD_NAME, meta={"deletionTimestamp": "t"})
    assert lifetimes.deleted({"metadata": {"uid": "u-a"}})
    lifetimes.pddeployment_event(event={"type": "ADDED"}, uid="u-after-reinstall")
    assert not lifetimes.deleted({"metadata": {"uid": "u-after-reinstall"}})
