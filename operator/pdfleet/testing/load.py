"""Load for end-to-end tests: phases of Poisson arrivals as one trace, replayed against a router in a background
thread, and the failures among the results."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pdfleet.loadgen.replay import VOCAB_SIZE, RequestResult, replay
from pdfleet.sim.trace import TraceRequest
from pdfleet.sim.workload import LoadProfile, generate


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

    def __init__(
        self, url: str, trace: Sequence[TraceRequest], model: str = "llama-8b", vocab_size: int = VOCAB_SIZE
    ) -> None:
        self.results: list[RequestResult] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(url, list(trace), model, vocab_size), daemon=True, name="load"
        )

    def _run(self, url: str, trace: list[TraceRequest], model: str, vocab_size: int) -> None:
        self.results = asyncio.run(
            replay(url, trace, model=model, vocab_size=vocab_size, request_timeout_s=60.0, stop=self._stop)
        )

    def __enter__(self) -> BackgroundLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def running(self) -> bool:
        """True while requests are still being sent or awaited."""
        return self._thread.is_alive()

    def wait(self, timeout: float) -> list[RequestResult]:
        """The results, once the whole trace has been replayed (AssertionError after `timeout` s)."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"load still running after {timeout} s"
        return self.results


def failures(results: Sequence[RequestResult]) -> list[str]:
    """The errors of failed requests (empty when every request completed)."""
    return [f"#{r.index}: {r.error}" for r in results if not r.ok]
