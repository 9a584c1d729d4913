"""Fixtures for operator tests: the CRD, GPU nodes on two racks, and the operator process, on the real control plane."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pdfleet.localfleet.controlplane import LocalControlPlane
from pdfleet.localfleet.operator_process import OperatorProcess, install_crd


@pytest.fixture(scope="session")
def kube(control_plane: LocalControlPlane) -> Iterator[Any]:
    """An admin ApiClient for the whole session."""
    client = control_plane.api_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def gpu_racks(control_plane: LocalControlPlane) -> list[str]:
    """rack-a and rack-b (zone-1, zone-2), two H100 nodes of 8 GPUs each."""
    return control_plane.standard_fleet_nodes(zone_of_rack={"rack-a": "zone-1", "rack-b": "zone-2"})


@pytest.fixture(scope="session")
def pdfleet_operator(control_plane: LocalControlPlane, kube: Any, gpu_racks: list[str]) -> Iterator[OperatorProcess]:
    install_crd(kube)
    operator = OperatorProcess(control_plane.kubeconfig, extra_env={"PDFLEET_RESYNC_SECONDS": "5"})
    operator.start()
    try:
        yield operator
    finally:
        operator.stop()
        print(f"--- operator log tail ({operator.log_path}) ---\n{operator.log_tail(30)}")
