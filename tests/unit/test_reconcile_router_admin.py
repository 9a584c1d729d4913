"""Which router pods the operator talks to: any running router for a fleet-view push, Ready ones for drain reads."""

from __future__ import annotations

from pdfleet.cluster.observed import PodState
from pdfleet.cluster.router_admin import router_admin_urls


def router(name: str, ip: str | None, ready: bool, terminating: bool = False, component: str = "router") -> PodState:
    return PodState(
        name=name,
        component=component,
        pool="",
        rack="",
        zone="",
        cell="",
        ip=ip,
        ready=ready,
        phase="Running",
        unschedulable_message=None,
        terminating=terminating,
    )


PODS = [
    router("r-ready", "10.0.0.1", True),
    router("r-starting", "fd00::2", False),
    router("r-no-ip", None, False),
    router("r-going", "10.0.0.3", True, terminating=True),
    router("p-0", "10.0.0.4", True, component="prefill"),
]


def test_a_push_goes_to_every_running_router_a_drain_read_to_ready_ones():
    # a router turns Ready only once its view lists a healthy decode: the push must not wait for readiness
    assert router_admin_urls(PODS, 8081, ready_only=False) == {
        "r-ready": "http://10.0.0.1:8081",
        "r-starting": "http://[fd00::2]:8081",
    }
    assert router_admin_urls(PODS, 8081, ready_only=True) == {"r-ready": "http://10.0.0.1:8081"}
