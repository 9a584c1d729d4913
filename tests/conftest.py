"""Fixtures shared by every test area: the real local Kubernetes control plane and a fresh namespace per test.

Tests that use `control_plane` (directly or through `namespace`) get the `controlplane` marker automatically, so
`pytest -m "not controlplane"` runs without the binaries that `.ci/install-control-plane.sh` builds.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pdfleet.localfleet.controlplane import LocalControlPlane, MissingBinariesError, namespace_name_for
from pdfleet.testing.prerequisites import missing_prerequisite


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that needs the control plane."""
    for item in items:
        if "control_plane" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.controlplane)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[LocalControlPlane]:
    """One LocalControlPlane for the whole run; skipped locally without binaries, a failure in CI (env CI set)."""
    plane = LocalControlPlane()
    try:
        plane.start()
    except MissingBinariesError as error:
        missing_prerequisite(str(error))
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def namespace(control_plane: LocalControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named after the test, ready for pods; deleted (without waiting) afterwards."""
    name = namespace_name_for(request.node.name)
    control_plane.create_namespace(name)
    try:
        yield name
    finally:
        control_plane.delete_namespace(name)
