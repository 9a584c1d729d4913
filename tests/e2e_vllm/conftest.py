"""End to end with real vLLM: one LocalFleet whose pod runner runs engine pods as real vLLM (CPU build, tiny Llama).

At most two engines run at a time on this machine (each ~3 GB; NIXL's thread keeps a core busy): every test here
sizes its PDDeployment to stay within that, and removes it before the next starts. Skipped locally when vLLM, the
control plane or Prometheus is missing; a failure in CI (env CI), where `./dev setup` installs them all.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pdfleet.localfleet import real_vllm
from pdfleet.localfleet.controlplane import namespace_name_for
from pdfleet.localfleet.harness import LocalFleet
from pdfleet.testing.prerequisites import missing_prerequisite, running_local_fleet


@pytest.fixture(scope="session")
def vllm_fleet() -> Iterator[LocalFleet]:
    """A one-rack local fleet whose engine pods are real vLLM processes."""
    if why := real_vllm.missing():
        missing_prerequisite(why)
    with running_local_fleet(racks=("rack-a",), nodes_per_rack=1, gpus_per_node=4, engine="vllm") as local:
        yield local


@pytest.fixture(scope="module")
def vllm_namespace(vllm_fleet: LocalFleet, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace for one test module; its pods (and so its engines) are gone before the next module starts."""
    name = namespace_name_for(request.module.__name__, keep=30)
    vllm_fleet.ensure_namespace(name)
    try:
        yield name
    finally:
        vllm_fleet.control_plane.delete_namespace(name)
        vllm_fleet.wait_for(
            lambda: not vllm_fleet.core.list_namespaced_pod(name).items, 60, f"pods of {name} gone", interval=1.0
        )
