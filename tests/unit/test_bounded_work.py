"""Bounded work: replica counts have a ceiling in the schema, placement costs O(racks) whatever the count, and the
reconcile daemon plans off the event loop."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from typing import Any

import pytest

from pdfleet.api.crd import generate_crd
from pdfleet.api.model import MAX_REPLICAS, SpecError, parse_spec
from pdfleet.reconcile.plan import ReconcilePlan
from pdfleet.render.router_access import AdminClients
from pdfleet.testing.builders import fake_node_info, fleet_spec, minimal_spec, pdd_body
from pdfleet.topology.placement import distribute_replicas, plan_placement


def test_replica_counts_have_a_ceiling_in_the_model_and_the_crd():
    assert MAX_REPLICAS == 1000
    parse_spec(fleet_spec(MAX_REPLICAS, 1))
    for pool_patch in (
        {"replicas": MAX_REPLICAS + 1},
        {"autoscaling": {"enabled": True, "maxReplicas": MAX_REPLICAS + 1}},
        {"autoscaling": {"enabled": True, "minReplicas": MAX_REPLICAS + 1, "maxReplicas": MAX_REPLICAS}},
    ):
        spec = fleet_spec(1, 1)
        spec["prefill"].update(pool_patch)
        with pytest.raises(SpecError, match="1000"):
            parse_spec(spec)
    schema = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    for pool in ("prefill", "decode"):
        node = schema[pool]["properties"]
        assert node["replicas"]["maximum"] == MAX_REPLICAS
        assert node["autoscaling"]["properties"]["maxReplicas"]["maximum"] == MAX_REPLICAS
        assert node["autoscaling"]["properties"]["minReplicas"]["maximum"] == MAX_REPLICAS


def _round_robin(pool_replicas: int, racks_with_capacity: dict[str, int]) -> dict[str, int]:
    """The documented rule, one replica at a time: the reference the fast implementation must equal."""
    capacity = {rack: cap for rack, cap in racks_with_capacity.items() if cap > 0}
    counts = dict.fromkeys(sorted(capacity), 0)
    remaining = max(pool_replicas, 0)
    while remaining > 0:
        open_racks = [rack for rack in counts if counts[rack] < capacity[rack]]
        if not open_racks:
            break
        for rack in open_racks[:remaining]:
            counts[rack] += 1
        remaining -= min(remaining, len(open_racks))
    return {rack: count for rack, count in counts.items() if count > 0}


def test_distribution_equals_the_one_at_a_time_deal():
    rng = random.Random(7)
    for _ in range(2000):
        racks = {f"r{i}": rng.choice([0, 1, 2, 3, 5, 8, 40]) for i in range(rng.randint(0, 6))}
        replicas = rng.randint(-1, 70)
        assert distribute_replicas(replicas, racks) == _round_robin(replicas, racks), (replicas, racks)
    for replicas, caps in itertools.product(range(0, 12), itertools.product(range(0, 4), repeat=3)):
        racks = dict(zip("cab", caps))
        assert distribute_replicas(replicas, racks) == _round_robin(replicas, racks)


def test_distribution_and_placement_cost_does_not_grow_with_the_replica_count():
    started = time.perf_counter()
    counts = distribute_replicas(4 * 10**6, {"rack-a": 10**9, "rack-b": 10**9, "rack-c": 7})
    assert counts == {"rack-a": 2 * 10**6 - 3, "rack-b": 2 * 10**6 - 4, "rack-c": 7}
    assert distribute_replicas(10**6, {"a": 2 * 10**5, "b": 10**9}) == {"a": 2 * 10**5, "b": 8 * 10**5}
    # GPU-less replicas: a node's capacity is not bounded by GPUs, so the requested count is what gets dealt.
    spec = minimal_spec(model="m", prefill={"gpusPerReplica": 0}, decode={"gpusPerReplica": 0})
    nodes = [fake_node_info(f"n-{r}", f"rack-{r}") for r in "ab"]
    placement = plan_placement(spec, nodes, pdd_name="f", replicas={"prefill": 10**9, "decode": 10**9})
    assert placement.replicas("decode") > 0 and placement.replicas("prefill") > 0
    assert time.perf_counter() - started < 1.0


class _Stopped:
    def __init__(self) -> None:
        self.flag = False

    def __bool__(self) -> bool:
        return self.flag


class _Memo:
    class kube:  # stands in for memo.kube
        @staticmethod
        def api_version_of(kind: str) -> str:
            return "policy/v1"

    operator_image = "img"
    admin_clients = AdminClients()


PLAN_SECONDS = 1.5


def test_the_reconcile_daemon_plans_off_the_event_loop(monkeypatch: pytest.MonkeyPatch):
    from pdfleet.reconcile import handlers

    slow_calls = []

    def slow_plan(**_: Any) -> ReconcilePlan:
        slow_calls.append(time.monotonic())
        time.sleep(PLAN_SECONDS)  # a placement or render that takes a while
        return ReconcilePlan()

    monkeypatch.setattr(handlers, "plan_reconcile", slow_plan)
    monkeypatch.setattr(handlers, "post_events", lambda body, events: None)
    body = pdd_body("f", fleet_spec(1, 1), namespace="ns", uid="u")
    indexes: dict[str, Any] = {name: {} for name in handlers.CHILD_INDEXES}

    async def scenario() -> float:
        stopped = _Stopped()
        daemon = asyncio.create_task(
            handlers.reconcile_daemon(
                namespace="ns",
                name="f",
                body=body,
                stopped=stopped,
                memo=_Memo(),
                node_index={},
                pod_index={},
                **indexes,
            )
        )
        worst, last = 0.0, time.monotonic()
        deadline = last + PLAN_SECONDS + 1.0
        while time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            worst, last = max(worst, now - last), now
        stopped.flag = True
        handlers._wake("ns", "f")
        await asyncio.wait_for(daemon, timeout=10)
        return worst

    try:
        worst = asyncio.run(scenario())
    finally:
        handlers._wakeups.pop(("ns", "f"), None)
        handlers.FLEETS.pop(("ns", "f"), None)
    assert slow_calls, "the daemon planned"
    # loose (a loaded machine delays a 10 ms tick too), yet far below a plan that holds the loop for all of its time
    assert worst < PLAN_SECONDS / 2, f"the event loop stalled {worst:.2f}s while the reconcile planned"
