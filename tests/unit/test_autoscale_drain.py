"""Drain-safe scale-down helpers."""

from __future__ import annotations

from pdfleet.autoscale.drain import drain_progress, pods_removed

POD = "llama-decode-rack-a-2"


def test_pods_removed_are_the_highest_ordinals_of_shrunk_cells():
    before = {"llama-decode-rack-a": 3, "llama-decode-rack-b": 2, "llama-decode-rack-c": 1}
    after = {"llama-decode-rack-a": 1, "llama-decode-rack-b": 2}
    assert pods_removed(before, after) == ["llama-decode-rack-a-1", "llama-decode-rack-a-2", "llama-decode-rack-c-0"]


def test_drain_waits_for_inflight_on_every_router():
    views = [[{"name": POD, "draining": True, "inflight": 2}], [{"name": POD, "draining": True, "inflight": 0}]]
    progress = drain_progress(views, {POD}, started_at=0, now=10, timeout_s=120)
    assert not progress.done and progress.inflight == 2
    assert progress.reason == "waiting: 2 requests in flight"


def test_drain_is_done_when_nothing_is_in_flight():
    views = [[{"name": POD, "draining": True, "inflight": 0}, {"name": "other", "inflight": 7}], []]
    progress = drain_progress(views, {POD}, started_at=0, now=10, timeout_s=120)
    assert progress.done and progress.inflight == 0


def test_drain_waits_for_silent_routers_and_routers_not_yet_draining():
    views = [None, [{"name": POD, "draining": False, "inflight": 0}]]
    progress = drain_progress(views, {POD}, started_at=0, now=10, timeout_s=120)
    assert not progress.done
    assert "1 routers not answering" in progress.reason and "not yet draining on a router: " + POD in progress.reason


def test_drain_timeout_ends_the_wait():
    views = [[{"name": POD, "draining": True, "inflight": 3}]]
    progress = drain_progress(views, {POD}, started_at=0, now=120, timeout_s=120)
    assert progress.done and progress.inflight == 3
    assert "timeout" in progress.reason
