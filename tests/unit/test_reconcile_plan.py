"""The reconcile decision, without a cluster: what gets written, what is left alone, what status says."""

from __future__ import annotations

import copy
import json
from typing import Any

from pdfleet.cluster.kube import APPLIED_HASH_ANNOTATION
from pdfleet.cluster.observed import ChildState, PodState, child_state, node_summary
from pdfleet.reconcile.plan import plan_reconcile, status_patch

NOW = "2026-12-02T00:00:00Z"


def node(name: str, rack: str, gpus: int = 8, product: str = "NVIDIA-H100-80GB-HBM3") -> dict[str, Any]:
    return node_summary(
        {
            "metadata": {
                "name": name,
                "labels": {
                    "topology.pdfleet.dev/rack": rack,
                    "topology.kubernetes.io/zone": "z1",
                    "nvidia.com/gpu.product": product,
                },
            },
            "spec": {},
            "status": {
                "allocatable": {"nvidia.com/gpu": str(gpus)},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )


NODES = [node("a0", "rack-a"), node("a1", "rack-a"), node("b0", "rack-b"), node("b1", "rack-b")]


def pdd(prefill: int = 2, decode: int = 2, status: dict | None = None, **spec_overrides: Any) -> dict[str, Any]:
    spec = {
        "model": {"name": "m", "servedModelName": "m"},
        "engine": {"kind": "vllm", "image": "vllm/vllm-openai:v0.32.0"},
        "prefill": {"replicas": prefill, "gpusPerReplica": 1},
        "decode": {"replicas": decode, "gpusPerReplica": 1},
        **spec_overrides,
    }
    return {
        "metadata": {"name": "f", "namespace": "ns", "uid": "u-1", "generation": 3},
        "spec": spec,
        "status": status or {},
    }


def plan(body: dict, children=(), pods=(), nodes=NODES):
    return plan_reconcile(
        pdd=body,
        nodes=nodes,
        children=list(children),
        pods=list(pods),
        pdb_api_version="policy/v1",
        operator_image="img",
        now=NOW,
    )


def as_running(applies) -> list[ChildState]:
    """What the cluster holds after the applies went through."""
    return [child_state(obj) for obj in applies]


def ready_pod(name: str, pool: str, rack: str, cell: str, ip: str) -> PodState:
    return PodState(
        name=name,
        component=pool,
        pool=pool,
        rack=rack,
        zone="z1",
        cell=cell,
        ip=ip,
        ready=True,
        phase="Running",
        unschedulable_message=None,
        terminating=False,
    )


def test_first_reconcile_applies_every_child_and_second_applies_nothing():
    first = plan(pdd())
    kinds = sorted({o["kind"] for o in first.applies})
    assert kinds == ["ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget", "Service", "StatefulSet"]
    assert all(APPLIED_HASH_ANNOTATION in o["metadata"]["annotations"] for o in first.applies)
    running = as_running(first.applies)
    second = plan(pdd(status=first.status), children=running)
    assert second.applies == () and second.deletes == ()
    body = pdd(status=second.status)
    assert status_patch(body["status"], plan(body, children=running).status) == {}


def test_scaling_one_pool_rewrites_only_that_pools_statefulsets():
    first = plan(pdd())
    second = plan(pdd(prefill=4, status=first.status), children=as_running(first.applies))
    changed = {(o["kind"], o["metadata"]["labels"].get("pdfleet.dev/pool")) for o in second.applies}
    assert changed == {("StatefulSet", "prefill")}


def test_invalid_spec_writes_nothing_but_status_and_warns():
    first = plan(pdd())
    bad = pdd(status=first.status)
    bad["spec"]["prefill"]["autoscaling"] = {"enabled": True, "minReplicas": 5, "maxReplicas": 2}
    result = plan(bad, children=as_running(first.applies))
    assert result.applies == () and result.deletes == ()
    invalid = next(c for c in result.status["conditions"] if c["type"] == "InvalidSpec")
    assert invalid["status"] == "True" and "minReplicas" in invalid["message"]
    assert [e.reason for e in result.events if e.type == "Warning"] == ["SpecError", "SpecRejected"]
    assert result.status["prefill"]["desiredReplicas"] == 2, "status keeps describing the running fleet"


def test_impossible_placement_keeps_running_children():
    first = plan(pdd())
    body = pdd(status=first.status)
    body["spec"]["decode"]["gpuProduct"] = "NVIDIA-B200"
    result = plan(body, children=as_running(first.applies))
    assert result.applies == () and result.deletes == ()
    degraded = next(c for c in result.status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "NoMatchingNodes"


def test_ready_pods_become_router_endpoints_with_draining_flags():
    first = plan(pdd())
    cells = {
        (o["metadata"]["labels"]["pdfleet.dev/pool"], o["metadata"]["labels"]["pdfleet.dev/rack"]): o["metadata"][
            "name"
        ]
        for o in first.applies
        if o["kind"] == "StatefulSet"
    }
    pods = [
        ready_pod(f"{cells[(pool, rack)]}-0", pool, rack, cells[(pool, rack)], f"127.1.0.{i}")
        for i, (pool, rack) in enumerate(sorted(cells), start=1)
    ]
    status = {
        **first.status,
        "drain": {
            "pool": "decode",
            "targetReplicas": 1,
            "endpoints": [cells[("decode", "rack-b")] + "-0"],
            "startedAt": NOW,
        },
    }
    result = plan(pdd(status=status), children=as_running(first.applies), pods=pods)
    configmap = next(o for o in result.applies if o["kind"] == "ConfigMap")
    view = json.loads(configmap["data"]["fleet.json"])
    assert [(e["pool"], e["rack"], e["draining"]) for e in view["endpoints"]] == [
        ("decode", "rack-a", False),
        ("decode", "rack-b", True),
        ("prefill", "rack-a", False),
        ("prefill", "rack-b", False),
    ]
    assert view["endpoints"][0]["url"].startswith("http://127.1.0.")
    assert result.status["prefill"]["summary"] == "2/2"


def test_fleet_view_revision_rises_with_its_content_only():
    first = plan(pdd())
    assert first.status["fleetView"]["revision"] == 1
    assert first.router_view is not None and first.router_view.view["revision"] == 1
    assert first.router_view.admin_port == 8081
    running = as_running(first.applies)
    same = plan(pdd(status=first.status), children=running)
    assert same.status["fleetView"] == first.status["fleetView"] and same.applies == ()
    status = {**first.status, "drain": {"pool": "decode", "targetReplicas": 1, "endpoints": ["x-0"], "startedAt": NOW}}
    pods = [ready_pod("x-0", "decode", "rack-a", "x", "127.1.0.9")]
    drained = plan(pdd(status=status), children=running, pods=pods)
    configmap = next(o for o in drained.applies if o["kind"] == "ConfigMap")
    assert json.loads(configmap["data"]["fleet.json"])["revision"] == 2 == drained.status["fleetView"]["revision"]
    assert drained.router_view.view["endpoints"][0]["draining"] is True
    bad = pdd(status=drained.status)
    bad["spec"]["prefill"]["replicas"] = -1
    rejected = plan(bad, children=as_running(drained.applies), pods=pods)
    assert rejected.router_view is None and rejected.status["fleetView"] == drained.status["fleetView"]


def test_removed_rack_deletes_its_cells_after_a_valid_plan():
    first = plan(pdd())
    only_a = [n for n in NODES if n["metadata"]["labels"]["topology.pdfleet.dev/rack"] == "rack-a"]
    result = plan(pdd(status=first.status), children=as_running(first.applies), nodes=only_a)
    deleted = {name for kind, name in result.deletes if kind == "StatefulSet"}
    assert deleted and all("rack-b" in name for name in deleted)
    applied = [o for o in result.applies if o["kind"] == "StatefulSet"]
    assert all(o["metadata"]["labels"]["pdfleet.dev/rack"] == "rack-a" for o in applied)


def test_condition_transitions_keep_their_time_and_emit_events_once():
    first = plan(pdd())
    running = as_running(first.applies)
    settled = plan(pdd(status=first.status), children=running)
    later = plan(pdd(status=copy.deepcopy(settled.status)), children=running)
    assert later.events == ()
    assert [c["lastTransitionTime"] for c in later.status["conditions"]] == [
        c["lastTransitionTime"] for c in settled.status["conditions"]
    ]


def test_metrics_condition_comes_from_the_autoscaler_report():
    first = plan(pdd())
    status = {
        **first.status,
        "autoscaler": {"metrics": {"available": False, "reason": "PrometheusDown", "message": "connection refused"}},
    }
    result = plan(pdd(status=status), children=as_running(first.applies))
    metrics = next(c for c in result.status["conditions"] if c["type"] == "MetricsAvailable")
    assert metrics["status"] == "False" and metrics["reason"] == "PrometheusDown"
    assert any(e.reason == "PrometheusDown" and e.type == "Warning" for e in result.events)
