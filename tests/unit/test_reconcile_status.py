"""Status as the operator writes it: every patch fits the status model (so the CRD's status schema), and the summary
and conditions say what is really going on (asked vs ready, why nothing progresses, what the router cannot serve)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from pdfleet.api.model import PDDeploymentStatus, parse_spec
from pdfleet.autoscale.signals import MetricsUnavailable, PoolSignals
from pdfleet.autoscale.step import plan_autoscale
from pdfleet.cluster.observed import ChildState, PodState, child_state, node_summary
from pdfleet.reconcile.plan import plan_reconcile, status_patch
from pdfleet.testing.builders import fleet_spec, node_body, pdd_body
from pdfleet.topology.inventory import node_info

NOW = "2026-12-02T00:00:00Z"
T0 = 1_800_000_000.0
NODES = [node_summary(node_body(f"n-{rack}-{i}", rack)) for rack in ("rack-a", "rack-b") for i in range(2)]
AUTOSCALED = {"enabled": True, "minReplicas": 1, "maxReplicas": 8, "scaleDownStabilizationSeconds": 0}


def body(prefills: int = 1, decodes: int = 1, status: dict | None = None, **sections: Any) -> dict[str, Any]:
    pdd = pdd_body("f", fleet_spec(prefills, decodes, model="m", image="i", **sections))
    pdd["metadata"].update(namespace="ns", uid="u-1", generation=1)
    pdd["status"] = status or {}
    return pdd


def unplaceable() -> dict[str, Any]:
    """A new fleet whose prefill asks for a GPU product no node has."""
    pdd = body(1, 1)
    pdd["spec"]["prefill"]["gpuProduct"] = "NVIDIA-B200"
    return pdd


def plan(pdd: dict, children=(), pods=(), nodes=NODES):
    return plan_reconcile(
        pdd=pdd,
        nodes=nodes,
        children=list(children),
        pods=list(pods),
        pdb_api_version="policy/v1",
        operator_image="img",
        now=NOW,
    )


def pod(name: str, pool: str, *, ready: bool = True, unschedulable: str | None = None) -> PodState:
    return PodState(
        name=name,
        component=pool,
        pool=pool,
        rack="rack-a",
        zone="z",
        cell=f"f-{pool}-rack-a",
        ip="10.0.0.1" if ready else None,
        ready=ready,
        phase="Running" if ready else "Pending",
        unschedulable_message=unschedulable,
        terminating=False,
    )


def ready_router() -> ChildState:
    return ChildState(kind="Deployment", name="f-router", applied_hash="h", replicas=1, ready_replicas=1)


def condition(status: dict, type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def without_nulls(value: Any) -> Any:
    """What a merge patch stores: a null deletes its key."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def assert_fits_status_model(patch: dict[str, Any]) -> None:
    """Every field of the patch is one the status model (hence the CRD schema) defines, with its type: a field the
    model does not know would be dropped (and pruned by the API server), a wrong type would be coerced."""
    stored = without_nulls(patch)
    parsed = PDDeploymentStatus.model_validate(stored)
    assert parsed.model_dump(by_alias=True, exclude_unset=True) == stored


def reconcile_statuses() -> list[dict[str, Any]]:
    first = plan(body(2, 2))
    running = [child_state(o) for o in first.applies]
    pods = [pod("f-prefill-rack-a-0", "prefill"), pod("f-decode-rack-a-0", "decode", ready=False)]
    invalid = body(status=first.status)
    invalid["spec"]["prefill"]["autoscaling"] = {"enabled": True, "minReplicas": 5, "maxReplicas": 2}
    autoscaled = {
        "autoscaler": {
            "metrics": {"available": True, "reason": "MetricsFresh", "message": "ok"},
            "prefill": {"desiredReplicas": 2, "signals": {"ttft_p90_ms": 812.0}, "drivingSignal": "latency"},
        }
    }
    return [
        first.status,
        plan(body(2, 2, status=first.status), children=running, pods=pods).status,
        plan(invalid, children=running).status,
        plan(body(1, 1, engine={"kind": "sglang", "image": "i"}, kvTransfer={"connector": "nixl"})).status,
        plan(unplaceable()).status,
        plan(body(status={**first.status, **autoscaled}, autoscaling=AUTOSCALED), children=running, pods=pods).status,
    ]


def autoscaler_statuses() -> list[dict[str, Any]]:
    spec_body = body(4, 2, autoscaling={**AUTOSCALED, "capacityTokensPerSecond": 1000})
    spec = parse_spec(spec_body["spec"])
    nodes = [node_info(n, spec.topology) for n in NODES]

    def reading(pool: str, latency: float) -> PoolSignals:
        return PoolSignals(pool, latency, latency, 0.0, 1.0, 0.1, 100.0, 100.0, 1.0, 2, T0)

    idle = {"prefill": reading("prefill", 0.05), "decode": reading("decode", 0.01)}
    down = {p: MetricsUnavailable(p, "missing_signals", "no samples", ("ttft",)) for p in ("prefill", "decode")}
    started = plan_autoscale(
        spec=spec, pdd_name="f", status={}, nodes=nodes, readings=idle, states={}, router_views=[], now=T0
    )
    assert started.status["drain"], "the scenario starts a drain"
    held = plan_autoscale(
        spec=spec, pdd_name="f", status={}, nodes=nodes, readings=down, states={}, router_views=[], now=T0
    )
    return [started.status, held.status]


@pytest.mark.parametrize("index", range(6))
def test_every_reconcile_status_patch_fits_the_status_model(index: int) -> None:
    status = reconcile_statuses()[index]
    assert_fits_status_model(status_patch({}, status))


@pytest.mark.parametrize("index", range(2))
def test_every_autoscaler_status_patch_fits_the_status_model(index: int) -> None:
    assert_fits_status_model(autoscaler_statuses()[index])


def test_unschedulable_pool_shows_what_was_asked_and_why_nothing_progresses() -> None:
    first = plan(body(1, 1))
    running = [child_state(o) for o in first.applies]
    stuck = [pod("f-prefill-rack-a-0", "prefill"), pod("f-decode-rack-a-0", "decode", ready=False, unschedulable="0/4")]
    status = plan(body(1, 1, status=first.status), children=running, pods=stuck).status
    assert status["decode"]["summary"] == "0/1"
    progressing = condition(status, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "Unschedulable")
    assert condition(status, "Ready")["reason"] == "Unschedulable"


def test_a_fleet_with_no_prefill_replica_is_ready_once_its_decodes_and_router_are() -> None:
    first = plan(body(0, 1))
    assert not [o for o in first.applies if o["kind"] == "StatefulSet" and "prefill" in o["metadata"]["name"]]
    running = [replace(child_state(o), ready_replicas=1) for o in first.applies]
    status = plan(body(0, 1, status=first.status), children=running, pods=[pod("f-decode-rack-a-0", "decode")]).status
    assert (status["prefill"]["summary"], status["decode"]["summary"]) == ("0/0", "1/1")
    ready = condition(status, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "FleetReady")
    assert "no prefill replicas: decodes serve requests whole" in ready["message"]
    no_decode = plan(body(0, 0, status=first.status), children=running).status
    assert condition(no_decode, "Ready")["status"] == "False"


def test_impossible_placement_of_a_new_fleet_shows_the_ask_and_the_reason() -> None:
    status = plan(unplaceable()).status
    assert (status["prefill"]["summary"], status["decode"]["summary"]) == ("0/1", "0/1")
    for type_ in ("Ready", "Progressing"):
        cond = condition(status, type_)
        assert (cond["status"], cond["reason"]) == ("False", "NoMatchingNodes"), cond
    assert "NVIDIA-B200" in condition(status, "Progressing")["message"]


def test_new_fleet_with_an_invalid_spec_says_nothing_was_created() -> None:
    pdd = body(1, 1)
    pdd["spec"]["prefill"]["autoscaling"] = {"enabled": True, "minReplicas": 5, "maxReplicas": 2}
    result = plan(pdd)
    assert result.applies == ()
    degraded = condition(result.status, "Degraded")
    assert degraded["reason"] == "SpecRejected" and "nothing was created" in degraded["message"]
    assert "last valid spec" not in degraded["message"]
    assert result.status["prefill"]["summary"] == "0/1"
    assert condition(result.status, "Ready")["reason"] == "InvalidSpec"


def test_rejected_update_keeps_describing_the_running_fleet() -> None:
    first = plan(body(1, 1))
    pdd = body(3, 1, status=first.status)
    pdd["spec"]["prefill"]["autoscaling"] = {"enabled": True, "minReplicas": 5, "maxReplicas": 2}
    status = plan(pdd, children=[child_state(o) for o in first.applies]).status
    assert "keeps running its last valid spec" in condition(status, "Degraded")["message"]
    assert status["prefill"]["desiredReplicas"] == 1


def test_pool_status_carries_the_selector_the_scale_subresource_reports() -> None:
    status = plan(body(1, 1)).status
    assert (
        status["decode"]["selector"]
        == "app.kubernetes.io/name=pdfleet,app.kubernetes.io/instance=f,pdfleet.dev/pool=decode"
    )
    assert status["model"] == "m" and status["routerUrl"] == "http://f-router.ns.svc:8080"


def test_sglang_fleet_is_reported_as_not_served_by_the_router() -> None:
    first = plan(body(1, 1, engine={"kind": "sglang", "image": "i"}))
    assert any(o["kind"] == "StatefulSet" for o in first.applies), "rendering stays"
    pods = [pod("f-prefill-rack-a-0", "prefill"), pod("f-decode-rack-a-0", "decode")]
    pdd = body(1, 1, status=first.status, engine={"kind": "sglang", "image": "i"})
    result = plan(pdd, children=[*map(child_state, first.applies), ready_router()], pods=pods)
    serves = condition(result.status, "RouterServes")
    assert (serves["status"], serves["reason"]) == ("False", "EngineNotServedByRouter")
    ready = condition(result.status, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "EngineNotServedByRouter")
    vllm = plan(
        body(1, 1, status=result.status), children=[*map(child_state, first.applies), ready_router()], pods=pods
    )
    assert condition(vllm.status, "RouterServes")["status"] == "True"
    assert "RouterServes" not in {c["type"] for c in plan(body(1, 1)).status["conditions"]}


@pytest.mark.parametrize(
    ("signals", "state"),
    [({"ttft_p90_ms": 812.0}, ("False", "Violated")), ({"ttft_p90_ms": 120.0}, ("True", "Met")), ({}, None)],
)
def test_sla_state_comes_from_the_autoscalers_latency_reading(signals: dict, state: tuple | None) -> None:
    report = {
        "autoscaler": {
            "metrics": {"available": True, "reason": "MetricsFresh", "message": "ok"},
            "prefill": {"desiredReplicas": 1, "signals": signals},
        }
    }
    status = plan(body(1, 1, status=report, autoscaling=AUTOSCALED)).status
    sla = condition(status, "SLAMet")
    assert (sla["status"], sla["reason"]) == (state or ("Unknown", "NotMeasured"))
    if state == ("False", "Violated"):
        assert "prefill TTFT p90 812 ms > 500 ms" in sla["message"]


def floor_report(prefill: dict[str, float], decode: dict[str, float] | None = None) -> dict[str, Any]:
    """status.autoscaler as the autoscaler writes it, with these signals per pool."""
    report: dict[str, Any] = {
        "metrics": {"available": True, "reason": "MetricsFresh", "message": "ok"},
        "prefill": {"desiredReplicas": 1, "signals": prefill},
    }
    if decode is not None:
        report["decode"] = {"desiredReplicas": 1, "signals": decode}
    return {"autoscaler": report}


UNATTAINABLE = {"latency_floor_ms": 1480.0, "target_unattainable": 1.0, "unattainable_requests_ratio": 0.62}
ATTAINABLE = {"latency_floor_ms": 180.0, "target_unattainable": 0.0}


@pytest.mark.parametrize(
    ("prefill", "state", "words"),
    [
        (
            UNATTAINABLE,
            ("False", "TargetUnattainable"),
            [
                "prefill TTFT p90 target 500 ms is below its floor (1480 ms)",
                "62 % of prefill requests need more than the 500 ms TTFT target on an idle replica",
                "raise the target or use faster hardware; adding replicas cannot help",
            ],
        ),
        (
            {"latency_floor_ms": 1480.0, "target_unattainable": 1.0},  # no request share: the rest is said
            ("False", "TargetUnattainable"),
            ["is below its floor (1480 ms). The floor is the latency no replica count removes"],
        ),
        (
            {**ATTAINABLE, "unattainable_requests_ratio": 0.037},
            ("True", "RequestsOverFloor"),
            [
                "3.7 % of prefill requests need more than the 500 ms TTFT target on an idle replica (their own"
                " prefill); the p90 target is still attainable (floor 180 ms)"
            ],
        ),
        (
            {**ATTAINABLE, "unattainable_requests_ratio": 0.0},
            ("True", "Attainable"),
            ["prefill TTFT p90 target 500 ms is above its floor (180 ms)"],
        ),
        (ATTAINABLE, ("True", "Attainable"), ["above its floor (180 ms)"]),
        ({"ttft_p90_ms": 812.0}, ("Unknown", "NotMeasured"), ["no latency floor"]),  # no model preset: no floor
    ],
    ids=["unattainable", "unattainable-without-share", "requests-over-floor", "none-over-floor", "attainable", "none"],
)
def test_sla_attainable_comes_from_the_autoscalers_latency_floor(
    prefill: dict[str, float], state: tuple[str, str], words: list[str]
) -> None:
    status = plan(body(1, 1, status=floor_report(prefill), autoscaling=AUTOSCALED)).status
    attainable = condition(status, "SLAAttainable")
    assert (attainable["status"], attainable["reason"]) == state
    for text in words:
        assert text in attainable["message"]


def test_sla_attainable_names_every_pool_whose_target_is_below_its_floor() -> None:
    decode = {"latency_floor_ms": 62.0, "target_unattainable": 1.0}
    status = plan(body(1, 1, status=floor_report(ATTAINABLE, decode), autoscaling=AUTOSCALED)).status
    attainable = condition(status, "SLAAttainable")
    assert (attainable["status"], attainable["reason"]) == ("False", "TargetUnattainable")
    assert attainable["message"].startswith("decode TPOT p90 target 50 ms is below its floor (62 ms).")
    assert "prefill" not in attainable["message"]  # its target is attainable


def test_sla_attainable_reads_only_autoscaled_pools_and_is_unknown_without_a_report() -> None:
    manual = plan(body(1, 1, status=floor_report(UNATTAINABLE))).status  # autoscaling off: the report is stale
    assert condition(manual, "SLAAttainable")["reason"] == "NotMeasured"
    fresh = condition(plan(body(1, 1)).status, "SLAAttainable")
    assert (fresh["status"], fresh["reason"]) == ("Unknown", "NotMeasured")


def test_unattainable_target_warns_once_on_the_transition_and_says_when_it_is_attainable_again() -> None:
    first = plan(body(1, 1, autoscaling=AUTOSCALED))
    running = [child_state(o) for o in first.applies]
    unattainable = {**first.status, **floor_report(UNATTAINABLE)}
    onset = plan(body(1, 1, status=unattainable, autoscaling=AUTOSCALED), children=running)
    warnings = [e for e in onset.events if e.reason == "TargetUnattainable"]
    assert len(warnings) == 1 and warnings[0].type == "Warning"
    assert warnings[0].message.startswith("SLAAttainable: prefill TTFT p90 target 500 ms is below its floor")
    same = plan(body(1, 1, status=onset.status, autoscaling=AUTOSCALED), children=running)
    assert not [e for e in same.events if e.reason == "TargetUnattainable"]  # shown in status meanwhile
    assert condition(same.status, "SLAAttainable") == condition(onset.status, "SLAAttainable")
    moved = {**onset.status, **floor_report({**UNATTAINABLE, "latency_floor_ms": 1510.0})}
    assert not plan(body(1, 1, status=moved, autoscaling=AUTOSCALED), children=running).events  # same state
    back = {**onset.status, **floor_report(ATTAINABLE)}
    again = plan(body(1, 1, status=back, autoscaling=AUTOSCALED), children=running)
    assert [(e.type, e.reason) for e in again.events] == [("Normal", "Attainable")]


def test_the_autoscalers_unattainable_report_becomes_the_condition_and_its_one_warning() -> None:
    scaling = {**AUTOSCALED, "capacityTokensPerSecond": 15_000}
    fleet = fleet_spec(2, 2, gpu_product="NVIDIA-H100-80GB-HBM3", autoscaling=scaling, sla={"ttftMs": 500})
    pdd = {**body(), "spec": fleet}  # the default model, which the performance model knows
    spec = parse_spec(pdd["spec"])
    long_prompts = PoolSignals("prefill", 3.0, None, 2.0, 2.0, 0.1, 30_000.0, 200.0, 1.0, 2, T0)  # ~1.5 s floor
    decode = PoolSignals("decode", None, 0.01, 0.0, 1.0, 0.1, 200.0, 200.0, 1.0, 2, T0)
    step = plan_autoscale(
        spec=spec,
        pdd_name="f",
        status={},
        nodes=[node_info(n, spec.topology) for n in NODES],
        readings={"prefill": long_prompts, "decode": decode},
        states={},
        router_views=[],
        now=T0,
    )
    assert not [e for e in step.events if e.reason == "TargetUnattainable"]  # one writer: the condition
    pdd["status"] = {"autoscaler": step.status["autoscaler"]}
    result = plan(pdd)
    attainable = condition(result.status, "SLAAttainable")
    assert (attainable["status"], attainable["reason"]) == ("False", "TargetUnattainable")
    assert [e.type for e in result.events if e.reason == "TargetUnattainable"] == ["Warning"]
