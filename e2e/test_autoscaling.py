"""The autoscaling loop end to end: engines -> Prometheus (pod-annotation discovery) -> operator's autoscaler ->
spec replicas -> reconcile -> StatefulSets -> pods run by the local pod runner -> router fleet view."""

from __future__ import annotations

import httpx
import pytest

from e2e_support import ReplicaLog, e2e_pdd
from pdfleet.localfleet.harness import LocalFleet
from pdfleet.testing.load import BackgroundLoad, Phase, failures, phased_trace


@pytest.mark.timeout(240)
def test_burst_scales_prefill_up_then_down_without_a_failed_request(fleet: LocalFleet, namespace: str):
    fleet.apply(e2e_pdd(fleet, "burst", namespace, prefill=1, decode=2, autoscale=["prefill"]))
    fleet.wait_serving(namespace, "burst")
    replicas = ReplicaLog(fleet, namespace, "burst")
    # 1000-token prompts: one emulated L4 prefills ~3 per second, so the 8 req/s burst needs 3 replicas.
    trace = phased_trace([Phase(8, 1, 1000, 8), Phase(20, 8, 1000, 8), Phase(50, 0.5, 1000, 8)])
    with BackgroundLoad(fleet.router_url(namespace, "burst"), trace) as load:
        replicas.follow(load, seconds=90)
        results = load.wait(timeout=60)
    fleet.wait_for(lambda: replicas.sample()["prefill"] == 1, 45, f"prefill back to 1 ({replicas})")
    assert replicas.peak("prefill") >= 2, f"prefill never scaled up: {replicas}"
    assert replicas.peak("decode") == 2, f"decode is not autoscaled and must stay at 2: {replicas}"
    assert failures(results) == [], f"{len(failures(results))} of {len(results)} requests failed"
    fleet.wait_serving(namespace, "burst")
    # the local kubelet refreshes ConfigMap files once a minute, as a real one does: the router runs the operator's
    # latest fleet view because the operator pushed it
    latest = fleet.get(namespace, "burst")["status"]["fleetView"]["revision"]
    assert latest > 2, "scale-up and scale-down each changed the fleet view"
    fleet.wait_for(lambda: router_fleet_revision(fleet, namespace, "burst") == latest, 5, "the pushed fleet view")


def router_fleet_revision(fleet: LocalFleet, namespace: str, name: str) -> int:
    reply = httpx.get(
        fleet.router_admin_url(namespace, name) + "/admin/fleet",
        headers=fleet.router_admin_headers(namespace, name),
        timeout=5.0,
        trust_env=False,
    )
    return reply.json()["revision"]


@pytest.mark.timeout(180)
def test_decode_heavy_phase_scales_decode_alone(fleet: LocalFleet, namespace: str):
    fleet.apply(e2e_pdd(fleet, "chat", namespace, prefill=1, decode=1, autoscale=["prefill", "decode"]))
    fleet.wait_serving(namespace, "chat")
    replicas = ReplicaLog(fleet, namespace, "chat")
    # Short prompts, long answers: ~28 streams in flight against a decode batch cap of 16 (--max-num-seqs); the
    # prefill is a third busy.
    trace = phased_trace([Phase(45, 3, 300, 128)])
    with BackgroundLoad(fleet.router_url(namespace, "chat"), trace) as load:
        replicas.follow(load, seconds=60)
        results = load.wait(timeout=60)
    assert replicas.peak("decode") >= 2, f"decode never scaled up: {replicas}"
    assert replicas.peak("prefill") == 1, f"prefill scaled although only decode was loaded: {replicas}"
    assert failures(results) == [], f"{len(failures(results))} of {len(results)} requests failed"
