"""End-to-end fixtures: one LocalFleet (control plane, 2 racks of emulated L4 nodes, operator, Prometheus, pod runner)
for the whole e2e run, and a fresh namespace per test whose PDDeployment and pods are removed afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pdfleet.localfleet.controlplane import namespace_name_for
from pdfleet.localfleet.harness import LocalFleet
from pdfleet.testing.prerequisites import running_local_fleet


@pytest.fixture(scope="session")
def fleet() -> Iterator[LocalFleet]:
    """The local fleet; skipped without control-plane binaries or Prometheus, except in CI (env CI) where it fails."""
    with running_local_fleet(racks=("rack-a", "rack-b"), nodes_per_rack=2, gpus_per_node=4) as local:
        yield local


@pytest.fixture
def namespace(fleet: LocalFleet, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test; afterwards its PDDeployments and pods go (grace 0), then the namespace."""
    name = namespace_name_for(request.node.name, keep=30)
    fleet.ensure_namespace(name)
    try:
        yield name
    finally:
        fleet.control_plane.delete_namespace(name)
