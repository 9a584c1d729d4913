"""Typos in a PDDeployment on the real API server: it prunes unknown fields (structural schema) and the operator tells
the user which ones, in a condition and a Warning Event, while the fleet runs on what the API server kept.

kubectl applies the manifests, as a user would: client-side apply (last-applied annotation) and server-side apply
(managedFields). The 1.20 test API server has no server-side field validation, so `--validate` cannot catch them.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml
from kubernetes import client

from pdfleet import API_GROUP, API_VERSION, PLURAL
from pdfleet.localfleet.controlplane import LocalControlPlane, cache_bin_dir, wait_until
from pdfleet.testing import builders


def kubectl_apply(control_plane: LocalControlPlane, manifest: dict[str, Any], *flags: str) -> None:
    command = [str(cache_bin_dir() / "kubectl"), "--kubeconfig", str(control_plane.kubeconfig), "apply", *flags]
    done = subprocess.run(
        [*command, "-f", "-"], input=yaml.safe_dump(manifest), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def _condition(custom: client.CustomObjectsApi, namespace: str, name: str, type_: str) -> dict[str, Any] | None:
    body = custom.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)
    return next((c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


@pytest.mark.parametrize("flags", [(), ("--server-side",)], ids=["client-side-apply", "server-side-apply"])
def test_unknown_fields_are_reported_and_the_fleet_still_runs(
    flags: tuple[str, ...], pdfleet_operator: Any, control_plane: LocalControlPlane, kube: Any, namespace: str
):
    custom, apps, core = client.CustomObjectsApi(kube), client.AppsV1Api(kube), client.CoreV1Api(kube)
    spec = builders.fleet_spec(2, 1, gpu_product=builders.H100)
    spec["prefill"]["replica"] = 3  # typo of replicas
    spec["autoscale"] = {"enabled": True}  # typo of autoscaler (and in the wrong place)
    manifest = builders.pdd_body("typos", spec, namespace=namespace)
    kubectl_apply(control_plane, manifest, "--validate=false", *flags)

    stored = custom.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, "typos")
    assert "autoscale" not in stored["spec"] and "replica" not in stored["spec"]["prefill"]  # pruned by the server

    unknown = wait_until(
        lambda: (c := _condition(custom, namespace, "typos", "UnknownFields")) and c["status"] == "True" and c,
        60,
        "an UnknownFields condition",
    )
    assert "spec.autoscale" in unknown["message"] and "spec.prefill.replica" in unknown["message"]
    wait_until(
        lambda: [
            e
            for e in core.list_namespaced_event(namespace).items
            if e.involved_object.kind == "PDDeployment"
            and e.type == "Warning"
            and e.reason == "UnknownFields"
            and "spec.prefill.replica" in e.message
        ],
        60,
        "a Warning Event naming the unknown fields",
    )
    # Nothing is held back or torn down: the fleet is rendered from the fields the API server kept.
    selector = "app.kubernetes.io/instance=typos,pdfleet.dev/pool=prefill"
    cells = apps.list_namespaced_stateful_set
    wait_until(
        lambda: sum(s.spec.replicas for s in cells(namespace, label_selector=selector).items) == 2,
        60,
        "the prefill cells of the spec as stored",
    )
    assert _condition(custom, namespace, "typos", "InvalidSpec")["status"] == "False"

    # Fixed: the condition clears.
    fixed = builders.pdd_body("typos", builders.fleet_spec(2, 1, gpu_product=builders.H100), namespace=namespace)
    kubectl_apply(control_plane, fixed, "--validate=false", *flags)
    wait_until(
        lambda: (c := _condition(custom, namespace, "typos", "UnknownFields")) and c["status"] == "False",
        60,
        "the UnknownFields condition cleared",
    )
