"""The router admin API's bearer token, and the operator noticing and repairing a fleet view it did not write: the
decision as a pure function, the admin client and the reconcile's push against a real router process on 127.0.0.1."""

from __future__ import annotations

import asyncio
import dataclasses
import http.server
import json
import threading

import httpx
import pytest

from pdfleet.api.model import parse_spec
from pdfleet.cluster.observed import PodState, node_summary
from pdfleet.cluster.router_admin import (
    KEEP,
    PUSH,
    REPLACE,
    WAIT,
    endpoint_views,
    router_view_action,
    sync_fleet_view,
)
from pdfleet.localfleet.processes import free_ports
from pdfleet.reconcile.plan import RouterView, plan_reconcile
from pdfleet.render.fleet_view import Endpoint, render_fleet_view
from pdfleet.router.service import RouterConfig, RouterService
from pdfleet.testing.router_process import RouterProcess

SPEC = parse_spec({"model": {"name": "m", "servedModelName": "m"}})
NODE = node_summary(
    {
        "metadata": {
            "name": "n0",
            "labels": {"topology.pdfleet.dev/rack": "rack-a", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        },
        "spec": {},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]},
    }
)


class _Healthy(http.server.BaseHTTPRequestHandler):
    """An "engine" that only answers GET /health (the router's readiness wants a healthy decode)."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


ENGINE = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
ENGINE_URL = f"http://127.0.0.1:{ENGINE.server_address[1]}"


def operator_view(generation: int, revision: int, decode_url: str = ENGINE_URL) -> dict:
    """A fleet view as the operator renders it (render_fleet_view, plus its revision)."""
    endpoints = [
        Endpoint("p-0", "prefill", ENGINE_URL, "rack-a", "z"),
        Endpoint("d-0", "decode", decode_url, "rack-a", "z"),
    ]
    return {**render_fleet_view(SPEC, generation, endpoints), "revision": revision}


def router_pod(name: str, ip: str = "127.0.0.1") -> PodState:
    return PodState(name, "router", "", "", "", "", ip, True, "Running", None, False)


@pytest.fixture(scope="module")
def router():
    thread = threading.Thread(target=ENGINE.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        with RouterProcess(operator_view(2, 5), ["--health-interval", "0.2"]) as proc:
            yield proc
    finally:
        ENGINE.shutdown()
        ENGINE.server_close()


# --------------------------------------------------------------------------------------------- pure decision
def test_router_view_action() -> None:
    desired = operator_view(2, 5)
    assert router_view_action(desired, json.loads(json.dumps(desired)), (2, 5)) == KEEP
    assert router_view_action(desired, None, (2, 5)) == PUSH  # no view loaded yet
    assert router_view_action(desired, operator_view(2, 4), (2, 5)) == PUSH  # behind: the file, a missed push
    assert router_view_action(desired, operator_view(1, 9), (2, 5)) == PUSH  # generation first
    # same order, other content: an ordinary PUT replaces it
    assert router_view_action(desired, operator_view(2, 5, "http://10.9.9.9:80"), (2, 5)) == PUSH
    # newer, but this operator wrote it (its plan came from a status a moment old): the next plan supersedes it
    assert router_view_action(desired, operator_view(2, 6), (2, 6)) == WAIT
    # newer than anything this operator wrote: someone else's
    assert router_view_action(desired, operator_view(2, 6, "http://10.9.9.9:80"), (2, 5)) == REPLACE
    assert router_view_action(desired, operator_view(99, 1), (2, 5)) == REPLACE


# --------------------------------------------------------------------------------------------- router process
def test_admin_api_wants_the_token_and_never_logs_it(router: RouterProcess) -> None:
    for path in ("/admin/fleet", "/admin/endpoints"):
        bare = httpx.get(router.admin + path, trust_env=False)
        assert bare.status_code == 401 and bare.headers["WWW-Authenticate"] == "Bearer"
        wrong = httpx.get(router.admin + path, headers={"Authorization": "Bearer nope"}, trust_env=False)
        assert wrong.status_code == 401
        assert httpx.get(router.admin + path, headers=router.admin_headers, trust_env=False).status_code == 200
    hijack = operator_view(99, 99, "http://10.6.6.6:80")
    assert httpx.put(router.admin + "/admin/fleet", json=hijack, trust_env=False).status_code == 401
    assert httpx.put(router.admin + "/admin/fleet/replace", json=hijack, trust_env=False).status_code == 401
    # Prometheus and the kubelet need no token
    for path in ("/metrics", "/health", "/ready"):
        assert httpx.get(router.admin + path, trust_env=False).status_code == 200
    current = httpx.get(router.admin + "/admin/fleet", headers=router.admin_headers, trust_env=False).json()
    assert current["generation"] == 2  # the refused PUTs changed nothing
    assert router.admin_token not in router.log()


def test_admin_api_without_a_token_file_is_closed_unless_insecure() -> None:
    async def status_of(config: RouterConfig) -> int:
        service = RouterService(config)
        await service.start()
        try:
            async with httpx.AsyncClient(trust_env=False) as client:
                return (await client.get(f"http://127.0.0.1:{config.admin_port}/admin/endpoints")).status_code
        finally:
            await service.stop()

    port, admin_port = free_ports(2)
    config = RouterConfig(host="127.0.0.1", port=port, admin_port=admin_port, shutdown_grace_seconds=0.1)
    assert asyncio.run(status_of(config)) == 403
    insecure = dataclasses.replace(config, insecure_admin=True)
    assert asyncio.run(status_of(insecure)) == 200


def test_sync_repairs_a_view_the_operator_did_not_write(router: RouterProcess) -> None:
    desired = operator_view(2, 5)
    routers = {"r-0": router.admin}
    first = sync_fleet_view(routers, desired, router.admin_token, (2, 5))
    assert (first.in_sync, first.repaired, first.failures) == (["r-0"], [], [])  # the mounted file's view
    # a token holder that is not the operator points the router elsewhere with a higher generation
    hijack = operator_view(99, 1, "http://10.6.6.6:80")
    taken = httpx.put(router.admin + "/admin/fleet", json=hijack, headers=router.admin_headers, trust_env=False)
    assert taken.status_code == 200
    # an ordinary PUT of the operator's view is refused as older: the old client counted that as taken
    stale = httpx.put(router.admin + "/admin/fleet", json=desired, headers=router.admin_headers, trust_env=False)
    assert stale.status_code == 409
    repaired = sync_fleet_view(routers, desired, router.admin_token, (2, 5))
    assert (repaired.in_sync, repaired.repaired, repaired.failures) == ([], ["r-0"], [])
    now = httpx.get(router.admin + "/admin/fleet", headers=router.admin_headers, trust_env=False).json()
    assert now == json.loads(json.dumps(desired))  # the operator's rendering round-trips exactly
    again = sync_fleet_view(routers, desired, router.admin_token, (2, 5))
    assert (again.in_sync, again.repaired) == (["r-0"], [])
    refused = sync_fleet_view(routers, desired, "not-the-token", (2, 5))
    assert refused.unauthorized and refused.failures == ["r-0: HTTP 401"]
    assert endpoint_views([router.admin], router.admin_token)[0] is not None
    assert endpoint_views([router.admin], "not-the-token") == [None]


class _Tokens:
    """AdminTokens without a Secret: the router's token."""

    def __init__(self, token: str) -> None:
        self.value, self.forgotten = token, 0

    def token(self, kube: object, pdd: object) -> str:
        return self.value

    def forget(self, pdd: object) -> None:
        self.forgotten += 1


def test_reconcile_reports_and_clears_a_repaired_view(router: RouterProcess) -> None:
    from pdfleet.reconcile import handlers

    pdd = {"metadata": {"name": "tamper", "namespace": "ns", "uid": "u-9", "generation": 2}, "spec": {}}
    key = ("ns", "tamper")
    desired = operator_view(2, 5)
    router_view = RouterView(desired, router.admin_port)
    pods = [router_pod("tamper-router-0")]
    tokens = _Tokens(router.admin_token)
    repairs = handlers.ROUTER_VIEW_REPAIRS.labels(*key)
    before = repairs._value.get()
    hijack = operator_view(7, 7, "http://10.6.6.6:80")
    assert (
        httpx.put(router.admin + "/admin/fleet", json=hijack, headers=router.admin_headers, trust_env=False).status_code
        == 200
    )
    assert not handlers.push_to_routers(None, tokens, pdd, router_view, pods)  # repaired: reconcile again soon
    assert repairs._value.get() == before + 1
    conflict = handlers._view_conflicts[key]
    assert "tamper-router-0" in conflict and router.admin_token not in conflict
    # the next plan reports it: Degraded with a Warning Event, until a plan without the record clears it
    body = {
        "metadata": {"name": "tamper", "namespace": "ns", "uid": "u-9", "generation": 2},
        "spec": {"model": {"name": "m"}, "prefill": {"replicas": 1}, "decode": {"replicas": 1}},
        "status": {"conditions": [{"type": "Degraded", "status": "False", "reason": "AsPlanned", "message": ""}]},
    }

    def degraded(conflict: str | None) -> tuple[dict, tuple]:
        plan = plan_reconcile(
            pdd=body,
            nodes=[NODE],
            children=[],
            pods=[],
            pdb_api_version="policy/v1",
            operator_image="img",
            now="2026-12-03T00:00:00Z",
            router_view_conflict=conflict,
        )
        return next(c for c in plan.status["conditions"] if c["type"] == "Degraded"), plan.events

    condition, events = degraded(conflict)
    assert (condition["status"], condition["reason"], condition["message"]) == ("True", "RouterViewTampered", conflict)
    assert any(e.type == "Warning" and e.reason == "RouterViewTampered" for e in events)
    assert degraded(None)[0]["reason"] == "AsPlanned"
    # the router runs the operator's view again: the next sync clears the record
    assert handlers.push_to_routers(None, tokens, pdd, router_view, pods)
    assert key not in handlers._view_conflicts and tokens.forgotten == 0
