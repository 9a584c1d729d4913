"""Two operator replicas with Kopf peering on the real control plane: exactly one acts, the other takes over when the
active one dies (SIGKILL: no goodbye to its peers), and carries out a change made meanwhile.

The session's standalone operator (tests/integration/conftest.py) watches every namespace and ignores peering, so it
is stopped while this module's replicas run and started again afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from pdfleet import API_GROUP, API_VERSION, PLURAL
from pdfleet.localfleet.controlplane import LocalControlPlane, wait_until
from pdfleet.localfleet.operator_process import OperatorProcess, install_kopf_peering, remove_crds
from pdfleet.testing import builders

PEERING = "pdfleet-ha"
LIFETIME_S = 10  # how long a silent replica counts as alive: the takeover bound's main term
RECONCILES = "pdfleet_operator_reconciles_total"


@pytest.fixture
def standalone_operator_stopped(pdfleet_operator: OperatorProcess) -> Iterator[None]:
    pdfleet_operator.stop()
    try:
        yield
    finally:
        pdfleet_operator.start()


@pytest.fixture
def replicas(
    control_plane: LocalControlPlane, kube: Any, namespace: str, standalone_operator_stopped: None
) -> Iterator[list[OperatorProcess]]:
    created = install_kopf_peering(kube, PEERING, namespace=namespace)
    args = ["--namespace", namespace, "--peering", PEERING, "--peering-lifetime", str(LIFETIME_S)]
    env = {"PDFLEET_RESYNC_SECONDS": "5"}
    operators = [OperatorProcess(control_plane.kubeconfig, extra_env=env, args=args) for _ in range(2)]
    try:
        for operator in operators:
            operator.start()
        yield operators
    finally:
        for index, operator in enumerate(operators):
            operator.stop()
            print(f"--- replica {index} log tail ({operator.log_path}) ---\n{operator.log_tail(25)}")
        if created:  # leave no CRD behind that a later `helm install` of the chart would refuse to adopt
            remove_crds(kube, created)


def _reconciles(operator: OperatorProcess) -> float:
    return operator.metric_sum(RECONCILES)


def _prefill_replicas(apps: client.AppsV1Api, namespace: str) -> int:
    selector = "app.kubernetes.io/instance=llama,pdfleet.dev/pool=prefill"
    return sum(s.spec.replicas for s in apps.list_namespaced_stateful_set(namespace, label_selector=selector).items)


def test_one_replica_acts_and_the_other_takes_over_when_it_is_killed(
    replicas: list[OperatorProcess], kube: Any, namespace: str, gpu_racks: list[str]
):
    custom, apps = client.CustomObjectsApi(kube), client.AppsV1Api(kube)
    spec = builders.fleet_spec(1, 1, gpu_product=builders.H100)
    custom.create_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, builders.pdd_body("llama", spec))
    wait_until(lambda: _prefill_replicas(apps, namespace) == 1, 90, "the fleet rendered by one of the replicas")

    # Both replicas are in the peering object, with distinct priorities; exactly one reconciles.
    peering = custom.get_namespaced_custom_object("kopf.dev", "v1", namespace, "kopfpeerings", PEERING)
    priorities = [peer["priority"] for peer in (peering.get("status") or {}).values()]
    assert len(priorities) == 2 and len(set(priorities)) == 2, peering.get("status")
    time.sleep(6)  # more than one resync period: a second active replica would have reconciled by now
    counts = [_reconciles(operator) for operator in replicas]
    assert sorted(count > 0 for count in counts) == [False, True], f"reconciles per replica: {counts}"
    active, standby = (replicas[0], replicas[1]) if counts[0] > 0 else (replicas[1], replicas[0])

    # The active replica dies without a word; a change arrives while no one is active.
    active.kill()
    killed_at = time.monotonic()
    custom.patch_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, PLURAL, "llama", {"spec": {"prefill": {"replicas": 3}}}
    )
    bound = LIFETIME_S + 50  # the dead replica's lifetime, then re-listing and one reconcile on a busy machine
    wait_until(lambda: _prefill_replicas(apps, namespace) == 3, bound, "the standby carrying out the change")
    took = time.monotonic() - killed_at
    wait_until(lambda: _reconciles(standby) > 0, 30, "the standby's reconcile counted")  # counted after its writes
    print(f"standby took over and applied the change {took:.1f}s after the kill")
