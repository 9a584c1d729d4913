"""Helpers of the end-to-end tests: PDDeployments sized for the local fleet, phased load, a replay running in the
background, and a recorder of the replicas the fleet asks for and has over time."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pdfleet import POOLS
from pdfleet.localfleet.demo import demo_pdd
from pdfleet.localfleet.harness import LocalFleet
from pdfleet.testing.load import BackgroundLoad


def e2e_pdd(
    fleet: LocalFleet,
    name: str,
    namespace: str,
    *,
    prefill: int = 1,
    decode: int = 1,
    autoscale: Sequence[str] = (),
    max_replicas: int = 3,
    scale_down_s: int = 15,
) -> dict[str, Any]:
    """The demo's PDDeployment (L4, Llama-3.1-8B) with fast autoscaling (3 s interval, 10 s window) on `autoscale`."""
    assert fleet.prometheus is not None
    pdd = demo_pdd(
        fleet.prometheus.url,
        name=name,
        namespace=namespace,
        max_replicas=max_replicas,
        interval_s=3,
        window_s=10,
        scale_down_s=scale_down_s,
    )
    for pool, replicas in (("prefill", prefill), ("decode", decode)):
        pdd["spec"][pool]["replicas"] = replicas
        pdd["spec"][pool]["autoscaling"]["enabled"] = pool in autoscale
    return pdd


class ReplicaLog:
    """spec.<pool>.replicas of one PDDeployment, sampled by `sample()`."""

    def __init__(self, fleet: LocalFleet, namespace: str, name: str) -> None:
        self.fleet, self.namespace, self.name = fleet, namespace, name
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._start = time.monotonic()

    def sample(self) -> dict[str, int]:
        spec = self.fleet.get(self.namespace, self.name)["spec"]
        replicas = {pool: spec[pool]["replicas"] for pool in POOLS}
        self.samples.append((round(time.monotonic() - self._start, 1), replicas))
        return replicas

    def follow(self, load: BackgroundLoad, seconds: float, every: float = 1.0) -> None:
        """Sample every `every` s while the load runs, for at most `seconds`."""
        deadline = time.monotonic() + seconds
        while load.running() and time.monotonic() < deadline:
            self.sample()
            time.sleep(every)

    def peak(self, pool: str) -> int:
        return max((r[pool] for _, r in self.samples), default=0)

    def __str__(self) -> str:
        return " ".join(f"{t:.0f}s:{r['prefill']}/{r['decode']}" for t, r in self.samples)
