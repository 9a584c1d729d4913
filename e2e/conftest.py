"""End-to-end fixtures: one LocalFleet (control plane, 2 racks of emulated L4 nodes, operator, Prometheus, pod runner)
for the whole e2e run, and a fresh namespace per test whose PDDeployment and pods are removed afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pdfleet.localfleet.controlplane import MissingBinariesError, namespace_name_for
from pdfleet.localfleet.harness import LocalFleet
from pdfleet.localfleet.prometheus import prometheus_binary
from pdfleet.testing.prerequisites import missing_prerequisite


@pytest.fixture(scope="session")
def fleet() -> Iterator[LocalFleet]:
    """The local fleet; skipped without control-plane binaries or Prometheus, except in CI (env CI) where it fails."""
    if prometheus_binary() is None:
        missing_prerequisite("prometheus binary not found (apt-get install prometheus, or ./dev setup)")
    local = LocalFleet(racks=("rack-a", "rack-b"), nodes_per_rack=2, gpus_per_node=4)
    try:
        local.start()
    except MissingBinariesError as error:
        missing_prerequisite(str(error))
    try:
        yield local
    finally:
        local.stop()


@pytest.fixture
def namespace(fleet: LocalFleet, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test; afterwards its PDDeployments and pods go (grace 0), then the namespace."""
    name = namespace_name_for(request.node.name, keep=30)
    fleet.ensure_namespace(name)
    try:
        yield name
    finally:
        fleet.control_plane.delete_namespace(name)
