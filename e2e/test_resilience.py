"""Failures end to end: a prefill pod dies under load, a rack loses its nodes, the operator restarts mid-scale."""

from __future__ import annotations

import time

import pytest

from e2e_support import e2e_pdd
from pdfleet.localfleet.harness import LocalFleet
from pdfleet.testing.load import BackgroundLoad, Phase, failures, phased_trace


@pytest.mark.timeout(150)
def test_killing_a_prefill_pod_mid_load_loses_no_request_and_the_statefulset_brings_it_back(
    fleet: LocalFleet, namespace: str
):
    fleet.apply(e2e_pdd(fleet, "kill", namespace, prefill=2, decode=2))
    fleet.wait_serving(namespace, "kill")
    trace = phased_trace([Phase(30, 4, 1000, 16)])
    with BackgroundLoad(fleet.router_url(namespace, "kill"), trace) as load:
        time.sleep(8)
        endpoints = fleet.router_endpoints(namespace, "kill")
        victim = max((e for e in endpoints if e["pool"] == "prefill"), key=lambda e: e["inflight"])["name"]
        old_uid = next(p for p in fleet.pods(namespace, "kill", "prefill") if p["metadata"]["name"] == victim)[
            "metadata"
        ]["uid"]
        fleet.kill_pod(namespace, victim)
        results = load.wait(timeout=80)
    assert failures(results) == [], f"{len(failures(results))} of {len(results)} requests failed"

    def recreated() -> bool:
        pod = next((p for p in fleet.pods(namespace, "kill", "prefill") if p["metadata"]["name"] == victim), None)
        return pod is not None and pod["metadata"]["uid"] != old_uid

    fleet.wait_for(recreated, 30, f"{victim} recreated by its StatefulSet")
    fleet.wait_serving(namespace, "kill", timeout=60)


@pytest.mark.timeout(150)
def test_removing_the_nodes_of_a_rack_replaces_the_fleet_on_the_other_rack(fleet: LocalFleet, namespace: str):
    fleet.apply(e2e_pdd(fleet, "racks", namespace, prefill=1, decode=1))
    fleet.wait_serving(namespace, "racks")
    placed = fleet.ready_by_rack(namespace, "racks")
    (rack,) = placed["decode"]  # RackPaired: one decode cell, the prefill in the same rack
    assert placed["prefill"] == {rack: 1}
    other = next(r for r in fleet.racks if r != rack)
    try:
        for node in fleet.nodes_of_rack(rack):
            fleet.delete_node(node)
        fleet.wait_for(
            lambda: fleet.ready_by_rack(namespace, "racks") == {"prefill": {other: 1}, "decode": {other: 1}},
            90,
            f"fleet re-placed on {other}",
        )
        fleet.wait_serving(namespace, "racks", timeout=60)
        cells = fleet.get(namespace, "racks")["status"]["cells"]
        assert {c["rack"] for c in cells} == {other}, cells
    finally:
        fleet.register_rack(rack)


@pytest.mark.timeout(150)
def test_operator_restart_mid_scale_converges(fleet: LocalFleet, namespace: str):
    fleet.apply(e2e_pdd(fleet, "restart", namespace, prefill=1, decode=1))
    fleet.wait_serving(namespace, "restart")
    fleet.patch(namespace, "restart", {"spec": {"prefill": {"replicas": 3}, "decode": {"replicas": 2}}})
    fleet.wait_for(lambda: len(fleet.pods(namespace, "restart", "prefill")) > 1, 30, "scale-up under way")
    fleet.restart_operator()
    fleet.wait_serving(namespace, "restart", timeout=90)

    def converged() -> bool:
        pdd = fleet.get(namespace, "restart")
        status = pdd.get("status", {})
        ready = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})
        return (
            status.get("observedGeneration") == pdd["metadata"]["generation"]
            and ready.get("status") == "True"
            and status["prefill"]["readyReplicas"] == 3
            and status["decode"]["readyReplicas"] == 2
        )

    fleet.wait_for(converged, 30, "status converged after the restart")
