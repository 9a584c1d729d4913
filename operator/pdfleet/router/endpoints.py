"""Runtime endpoint state: health, draining, in-flight counts, connection pools; applying fleet views; health checks."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Iterator

from .fleet_view import EndpointSpec, FleetView
from .httpclient import UpstreamPool, fetch, request_bytes

log = logging.getLogger("pdfleet.router")
TIMEOUT_HOLD_SECONDS = 15.0  # default hold-out of an endpoint whose leg timed out (router flag --timeout-hold-seconds)
TIMEOUT_HOLD_MAX_FACTOR = 16  # consecutive hold-outs double it up to this many times


class EndpointState:
    """One upstream engine as the router sees it now (satisfies policy.Candidate)."""

    __slots__ = (
        "spec",
        "name",
        "pool_name",
        "rack",
        "zone",
        "draining",
        "healthy",
        "inflight",
        "pool",
        "retired",
        "host_header",
        "hold_until",
        "strikes",
        "_heads",
    )

    def __init__(self, spec: EndpointSpec, connect_timeout: float) -> None:
        self.spec = spec
        self.name = spec.name
        self.pool_name = spec.pool
        self.rack = spec.rack
        self.zone = spec.zone
        self.draining = spec.draining
        self.healthy = True  # the operator lists only Ready pods; checks and failures say otherwise
        self.inflight = 0
        self.retired = False
        self.pool = UpstreamPool(spec.host, spec.port, connect_timeout)
        self.host_header = f"{spec.host}:{spec.port}".encode()
        self.hold_until = 0.0  # loop time before which health checks may not bring it back (a leg timed out)
        self.strikes = 0  # consecutive hold-outs without serving in between
        self._heads: dict[bytes, bytes] = {}

    def post_head(self, path: bytes) -> bytes:
        """Precomputed `POST path` request head up to the X-Request-Id value."""
        head = self._heads.get(path)
        if head is None:
            head = b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nX-Request-Id: " % (
                path,
                self.host_header,
            )
            self._heads[path] = head
        return head

    def as_json(self) -> dict[str, Any]:
        """The /admin/endpoints row (retired endpoints still carrying work show as draining)."""
        return {
            "name": self.name,
            "url": self.spec.url,
            "pool": self.pool_name,
            "rack": self.rack,
            "healthy": self.healthy,
            "draining": self.draining or self.retired,
            "inflight": self.inflight,
        }


class EndpointRegistry:
    """The fleet view in force plus per-endpoint runtime state that survives view changes."""

    def __init__(self, connect_timeout: float = 2.0, timeout_hold_seconds: float = TIMEOUT_HOLD_SECONDS) -> None:
        self.connect_timeout = connect_timeout
        self.timeout_hold_seconds = timeout_hold_seconds
        self.view: FleetView | None = None
        self.by_name: dict[str, EndpointState] = {}
        self.prefills: list[EndpointState] = []
        self.decodes: list[EndpointState] = []
        self.retired: dict[int, EndpointState] = {}  # removed from the view, still finishing in-flight work

    def apply(self, view: FleetView) -> None:
        """Switch to a new view: keep state of unchanged endpoints, retire removed ones without cutting their work."""
        old = self.by_name
        fresh: dict[str, EndpointState] = {}
        for spec in view.endpoints:
            state = old.get(spec.name)
            if state is None or state.spec.url != spec.url or state.pool_name != spec.pool:
                state = EndpointState(spec, self.connect_timeout)
            else:
                state.spec = spec
                state.rack, state.zone, state.draining = spec.rack, spec.zone, spec.draining
            fresh[spec.name] = state
        kept = {id(s) for s in fresh.values()}
        for state in old.values():
            if id(state) not in kept:
                state.retired = True
                state.pool.close()
                if state.inflight:
                    self.retired[id(state)] = state
        self.by_name = fresh
        self.prefills = [s for s in fresh.values() if s.pool_name == "prefill"]
        self.decodes = [s for s in fresh.values() if s.pool_name == "decode"]
        self.view = view

    def leg_done(self, state: EndpointState) -> None:
        """Bookkeeping after a leg ends: forget a retired endpoint once it has no work left."""
        state.inflight -= 1
        if state.retired and state.inflight == 0:
            self.retired.pop(id(state), None)

    def leg_timed_out(self, state: EndpointState, now: float, alive_window: float) -> bool:
        """A leg on `state` got no first byte or fell silent in time. Unless other legs got bytes from it within
        `alive_window` seconds (busy, not hung), it is taken out and held out of health checks, which its /health
        would pass even when hung, for the hold time: doubled for each consecutive hold-out (up to
        TIMEOUT_HOLD_MAX_FACTOR times), reset once it has served again. True if it is held out."""
        if now - state.pool.last_data < alive_window:
            return False
        state.healthy = False
        if now < state.hold_until:
            return True  # one more leg of the same episode
        if state.pool.last_data > state.hold_until:
            state.strikes = 0  # it served since its last hold-out
        state.strikes += 1
        factor = min(2 ** (state.strikes - 1), TIMEOUT_HOLD_MAX_FACTOR)
        state.hold_until = now + self.timeout_hold_seconds * factor
        log.warning(
            "endpoint %s (%s) timed out with no sign of life: held out for %gs",
            state.name,
            state.spec.url,
            self.timeout_hold_seconds * factor,
        )
        return True

    @staticmethod
    def may_recover(state: EndpointState, now: float) -> bool:
        """Whether a passing health check may mark `state` healthy now (its hold-out, if any, is over)."""
        return now >= state.hold_until

    def all_states(self) -> Iterator[EndpointState]:
        """Endpoints in the view, then retired ones still carrying work."""
        yield from self.by_name.values()
        yield from list(self.retired.values())

    def rows(self) -> Iterator[tuple[str, str, int, bool]]:
        """(name, pool, inflight, healthy) rows for the metrics gauges."""
        for s in self.all_states():
            yield s.name, s.pool_name, s.inflight, s.healthy

    def ready(self) -> bool:
        """Ready once a view with at least one healthy decode is loaded."""
        return any(s.healthy for s in self.decodes)

    def close(self) -> None:
        """Close every idle upstream connection."""
        for s in self.all_states():
            s.pool.close()


async def check_endpoint(state: EndpointState, timeout: float) -> bool:
    """GET /health on one endpoint; healthy iff it answers 200 within `timeout`."""
    request = request_bytes(b"GET", b"/health", state.host_header)
    reply = await fetch(state.pool, request, timeout)
    return reply.error is None and reply.status == 200


async def health_loop(registry: EndpointRegistry, interval: float, timeout: float, stop: asyncio.Event) -> None:
    """Check every endpoint each `interval` seconds until `stop` is set; logs transitions."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        states = list(registry.by_name.values())
        results = await asyncio.gather(*(check_endpoint(s, timeout) for s in states), return_exceptions=True)
        now = loop.time()
        for state, ok in zip(states, results):
            ok = ok is True and registry.may_recover(state, now)
            if ok != state.healthy:
                log.warning("endpoint %s (%s) is now %s", state.name, state.spec.url, "healthy" if ok else "unhealthy")
            state.healthy = ok
        try:
            await asyncio.wait_for(stop.wait(), interval)
        except asyncio.TimeoutError:
            pass
