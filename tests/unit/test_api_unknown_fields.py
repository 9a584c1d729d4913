"""Spec fields the operator does not know: the API server prunes them, the operator still tells the user.

The CRD's structural schema makes the API server drop unknown fields silently (so `kubectl apply --validate=strict`
can reject them on servers with field validation); what the user wrote survives in kubectl's last-applied annotation
(client-side apply) and in the `Apply` managedFields entries (server-side apply), and the operator reads it there.
"""

from __future__ import annotations

import json
from typing import Any

from pdfleet.api.model import applied_unknown_fields, unknown_fields
from pdfleet.cluster.observed import node_summary
from pdfleet.reconcile.plan import plan_reconcile
from pdfleet.testing.builders import fleet_spec, node_body, pdd_body

NOW = "2026-12-02T00:00:00Z"
NODES = [node_summary(node_body(f"n-{rack}", rack)) for rack in ("rack-a", "rack-b")]


def test_unknown_fields_names_every_unknown_path_and_nothing_else():
    spec = fleet_spec(2, 2)
    assert unknown_fields(spec) == []
    spec["prefill"]["replica"] = 3
    spec["autoscale"] = {"enabled": True}
    spec["engine"]["env"] = [{"name": "A", "valuee": "x"}, {"name": "B", "valueFrom": {"anything": {"goes": 1}}}]
    spec["decode"]["gpus_per_replica"] = 2  # snake_case is not the wire name: the API server prunes it too
    spec["decode"]["resources"] = {"cpu": "8", "example.com/thing": "1"}  # a map: any key is fine
    spec["decode"]["nodeSelector"] = {"any/label": "x"}
    spec["autoscaler"] = {"pdRatio": {"min": 1, "max": 2, "mid": 1.5}}
    assert unknown_fields(spec) == [
        "spec.autoscale",
        "spec.autoscaler.pdRatio.mid",
        "spec.decode.gpus_per_replica",
        "spec.engine.env[0].valuee",
        "spec.prefill.replica",
    ]


def test_unknown_fields_of_a_non_object_are_none():
    assert unknown_fields({"prefill": "three"}) == []  # a type error is the schema's to report, not a typo
    assert unknown_fields([]) == []


def _last_applied(spec: dict[str, Any]) -> dict[str, str]:
    manifest = pdd_body("f", spec, namespace="ns", annotations={})
    return {"kubectl.kubernetes.io/last-applied-configuration": json.dumps(manifest)}


def test_fields_pruned_by_the_api_server_are_read_from_the_last_applied_configuration():
    written = fleet_spec(1, 1)
    written["prefill"]["replica"] = 3
    written["autoscale"] = {"enabled": True}
    live = fleet_spec(1, 1)  # what the API server kept
    metadata = {"name": "f", "annotations": _last_applied(written)}
    assert applied_unknown_fields(metadata, live) == ["spec.autoscale", "spec.prefill.replica"]
    assert applied_unknown_fields({"name": "f"}, live) == []
    broken = {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{not json"}}
    assert applied_unknown_fields(broken, live) == []


def test_fields_pruned_by_the_api_server_are_read_from_server_side_apply_managed_fields():
    applied = {
        "f:spec": {
            ".": {},
            "f:autoscale": {".": {}, "f:enabled": {}},
            "f:model": {".": {}, "f:name": {}},
            "f:prefill": {".": {}, "f:replica": {}, "f:replicas": {}},
            "f:engine": {"f:env": {}},
        }
    }
    updated = {"f:spec": {"f:prefill": {"f:replicas": {}}}, "f:status": {"f:whatever": {}}}
    metadata = {
        "managedFields": [
            {"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": applied},
            {"manager": "pdfleet-operator", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": updated},
        ]
    }
    assert applied_unknown_fields(metadata, fleet_spec(1, 1)) == ["spec.autoscale", "spec.prefill.replica"]


def _body(spec_written: dict[str, Any], status: dict | None = None) -> dict[str, Any]:
    live = fleet_spec(1, 1)
    return {
        "metadata": {
            "name": "f",
            "namespace": "ns",
            "uid": "u-1",
            "generation": 2,
            "annotations": _last_applied(spec_written),
        },
        "spec": live,
        "status": status or {},
    }


def _plan(body: dict[str, Any]):
    return plan_reconcile(
        pdd=body, nodes=NODES, children=[], pods=[], pdb_api_version="policy/v1", operator_image="img", now=NOW
    )


def test_unknown_fields_become_a_condition_and_a_warning_event_and_the_fleet_is_still_rendered():
    written = fleet_spec(1, 1)
    written["prefill"]["replica"] = 3
    written["autoscale"] = {"enabled": True}
    result = _plan(_body(written))
    assert {obj["kind"] for obj in result.applies} >= {"StatefulSet", "Service", "Deployment", "ConfigMap"}
    assert result.deletes == ()
    unknown = next(c for c in result.status["conditions"] if c["type"] == "UnknownFields")
    assert unknown["status"] == "True" and unknown["reason"] == "UnknownFields"
    assert "spec.autoscale" in unknown["message"] and "spec.prefill.replica" in unknown["message"]
    invalid = next(c for c in result.status["conditions"] if c["type"] == "InvalidSpec")
    assert invalid["status"] == "False"  # the spec the API server kept is valid and runs
    warnings = [e for e in result.events if e.type == "Warning" and e.reason == "UnknownFields"]
    assert len(warnings) == 1 and "spec.prefill.replica" in warnings[0].message

    # Steady: no second Event; a new typo: a new Event; fixed: the condition turns False.
    again = _plan(_body(written, status=result.status))
    assert [e for e in again.events if e.reason == "UnknownFields"] == []
    written["decode"]["replcias"] = 2
    more = _plan(_body(written, status=result.status))
    assert [e.message for e in more.events if e.reason == "UnknownFields" and "spec.decode.replcias" in e.message]
    fixed = _plan(_body(fleet_spec(1, 1), status=more.status))
    cleared = next(c for c in fixed.status["conditions"] if c["type"] == "UnknownFields")
    assert cleared["status"] == "False"


def test_a_spec_without_unknown_fields_gets_no_unknown_fields_condition():
    result = _plan(_body(fleet_spec(1, 1)))
    assert "UnknownFields" not in {c["type"] for c in result.status["conditions"]}
