"""Helpers of the end-to-end tests: PDDeployments sized for the local fleet, phased load, a replay running in the
background, and a recorder of the replicas the fleet asks for and has over time."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pdfleet import POOLS
from pdfleet.loadgen.replay import RequestResult, replay
from pdfleet.localfleet.demo import demo_pdd
from pdfleet.localfleet.harness import LocalFleet
from pdfleet.sim.trace import TraceRequest
from pdfleet.sim.workload import LoadProfile, generate


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


@dataclass(frozen=True)
class Phase:
    """`seconds` of Poisson arrivals at `rps` with log-normal lengths around `prompt` / `output` tokens."""

    seconds: float
    rps: float
    prompt: int
    output: int


def phased_trace(phases: Sequence[Phase], seed: int = 0) -> list[TraceRequest]:
    """The phases one after another as one trace."""
    trace: list[TraceRequest] = []
    offset = 0.0
    for index, phase in enumerate(phases):
        profile = LoadProfile(
            kind="steady",
            duration_s=phase.seconds,
            base_rps=phase.rps,
            prompt_median=phase.prompt,
            prompt_sigma=0.2,
            output_median=phase.output,
            output_sigma=0.2,
        )
        trace += [replace(r, arrival=r.arrival + offset) for r in generate(profile, seed + index)]
        offset += phase.seconds
    return trace


class BackgroundLoad:
    """A replay of `trace` against `url` in its own thread; `wait()` returns the results."""

    def __init__(self, url: str, trace: Sequence[TraceRequest], model: str = "llama-8b") -> None:
        self.results: list[RequestResult] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url, list(trace), model), daemon=True, name="load")

    def _run(self, url: str, trace: list[TraceRequest], model: str) -> None:
        self.results = asyncio.run(replay(url, trace, model=model, request_timeout_s=60.0, stop=self._stop))

    def __enter__(self) -> BackgroundLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def running(self) -> bool:
        return self._thread.is_alive()

    def wait(self, timeout: float) -> list[RequestResult]:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"load still running after {timeout} s"
        return self.results


def failures(results: Sequence[RequestResult]) -> list[str]:
    """The errors of failed requests (empty when every request completed)."""
    return [f"#{r.index}: {r.error}" for r in results if not r.ok]


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
