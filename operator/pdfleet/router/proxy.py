"""The data path: OpenAI-compatible front door running vLLM's two-stage PD handshake with bounded failover.

Per request: JSON is parsed once; the prefill leg's small reply is collected; the decode leg's reply is forwarded from
the upstream socket callbacks straight to the client socket (HTTP chunks re-framed, SSE bytes untouched).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from functools import partial
from typing import Any, Awaitable, Callable, Generic, TypeVar

from . import failover, handshake, policy
from .endpoints import EndpointRegistry, EndpointState
from .failover import Action, Decision, Outcome
from .httpclient import ABORTED, PROTOCOL, TIMEOUT, CollectSink, UpstreamConnection, UpstreamError
from .httpserver import ClientConnection, Request, response_head
from .metrics import RouterMetrics

COMPLETION_PATHS = frozenset({b"/v1/completions", b"/v1/chat/completions"})
DISAGGREGATED, DIRECT, FALLBACK = "disaggregated", "direct", "fallback"
_JSON = b"application/json"
_SSE = b"text/event-stream"
_LAST_CHUNK = b"0\r\n\r\n"


def outcome_of_error(error: UpstreamError) -> Outcome:
    """Map a transport failure of a leg that sent nothing to the client yet to a failover Outcome."""
    if error.kind == ABORTED:
        return Outcome.CLIENT_GONE
    if error.kind == TIMEOUT:
        return Outcome.TIMEOUT
    if error.kind == PROTOCOL:
        return Outcome.UPSTREAM_5XX
    return Outcome.CONNECT_FAILED  # refused, reset, or closed before a complete reply


def outcome_of_status(status: int) -> Outcome:
    """Map an upstream HTTP status to a failover Outcome."""
    if status < 300:
        return Outcome.OK
    return Outcome.UPSTREAM_4XX if 400 <= status < 500 else Outcome.UPSTREAM_5XX


class StreamSink:
    """Forwards a decode reply to the client as it arrives; holds back error replies so the leg can be retried."""

    __slots__ = (
        "client",
        "loop",
        "done",
        "status",
        "content_type",
        "forward",
        "chunked",
        "committed",
        "parts",
        "out",
        "events",
        "t_first",
        "t_last",
        "error",
        "outcome",
    )

    def __init__(self, client: ClientConnection, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        self.done: asyncio.Future[None] = loop.create_future()
        self.status = 0
        self.content_type = _JSON
        self.forward = False
        self.chunked = False
        self.committed = False  # bytes reached the client: the leg can no longer be retried
        self.parts: list[bytes] = []
        self.out: list[bytes] = []
        self.events = 0
        self.t_first = 0.0
        self.t_last = 0.0
        self.error = ""
        self.outcome = Outcome.OK

    def rebind(self, conn: UpstreamConnection) -> None:
        """The exchange moved to a fresh connection (stale keep-alive socket)."""
        if not self.client.closed:
            self.client.upstream = conn

    def on_head(self, status: int, content_type: bytes, content_length: int) -> None:  # noqa: D102
        self.status = status
        if content_type:
            self.content_type = content_type
        self.forward = 200 <= status < 300
        self.chunked = content_length < 0

    def on_body(self, data: bytes) -> None:  # noqa: D102
        if self.forward and self.chunked:
            self.out.append(b"%x\r\n%b\r\n" % (len(data), data))
            self.events += data.count(b"\n\n")
        else:
            self.parts.append(data)

    def on_batch_end(self) -> None:  # noqa: D102
        out = self.out
        if not out:
            return
        payload = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        now = self.loop.time()
        if not self.committed:
            self.committed = True
            self.t_first = now
            payload = response_head(self.status, self.content_type, True) + payload
        self.t_last = now
        self.client.write(payload)

    def on_complete(self) -> None:  # noqa: D102
        if self.forward and self.chunked:
            self.out.append(_LAST_CHUNK)
            self.on_batch_end()
        elif self.forward:
            body = b"".join(self.parts)
            self.client.write(
                response_head(self.status, self.content_type, False)
                + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            self.committed = True
        else:
            self.outcome = outcome_of_status(self.status)
            self.error = f"HTTP {self.status}"
        self._resolve()

    def on_failure(self, error: UpstreamError) -> None:  # noqa: D102
        self.error = str(error)
        if self.committed and error.kind != ABORTED:
            self.outcome = Outcome.DIED_MID_STREAM
        else:
            self.outcome = outcome_of_error(error)
        self._resolve()

    def _resolve(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    @property
    def body(self) -> bytes:
        """Body of a held-back (error) reply."""
        return b"".join(self.parts)


R = TypeVar("R")


class Retries(Generic[R]):
    """The one bounded retry loop of a leg (prefill, decode or direct) of one request.

    Each round picks an endpoint not tried yet, attempts the leg on it, marks the endpoint unhealthy when the outcome
    says it is unwell (the health loop brings it back) and asks failover what next. On RETRY the endpoint is excluded,
    the retry counted in the leg's retries metric and the next round starts; any other decision ends the loop.
    """

    def __init__(self, leg: str, decide: Callable[[Outcome, int], Decision], metrics: RouterMetrics) -> None:
        self.leg = leg
        self.decide = decide  # failover rule: (outcome, retries done) -> Decision
        self.metrics = metrics
        self.tried: set[str] = set()  # endpoints retried away from: one per retry done

    async def run(
        self,
        pick: Callable[[set[str]], EndpointState | None],
        attempt: Callable[[EndpointState], Awaitable[tuple[Outcome, R]]],
    ) -> tuple[EndpointState, R, Decision] | None:
        """(endpoint, attempt's result, decision) of the attempt that ended the leg; None once no endpoint is left."""
        while True:
            endpoint = pick(self.tried)
            if endpoint is None:
                return None
            outcome, result = await attempt(endpoint)
            if outcome in failover.MARKS_UNHEALTHY:
                endpoint.healthy = False  # passive marking; the health loop brings it back
            decision = self.decide(outcome, len(self.tried))
            if decision.action is not Action.RETRY:
                return endpoint, result, decision
            self.tried.add(endpoint.name)
            self.metrics.retries[self.leg] += 1


class PDRouter:
    """The request handler of the data port."""

    def __init__(self, registry: EndpointRegistry, metrics: RouterMetrics) -> None:
        self.registry = registry
        self.metrics = metrics
        self.affinity = policy.PrefixAffinity()
        self.loop = asyncio.get_running_loop()
        self._tick = itertools.count()
        self._ids = itertools.count()
        self._id_prefix = os.urandom(6).hex().encode()

    # -- entry ----------------------------------------------------------------------------------------------------
    def handle(self, conn: ClientConnection, request: Request) -> None:
        """Dispatch one request (httpserver.Application)."""
        path = request.path
        if path in COMPLETION_PATHS and request.method == b"POST":
            self.loop.create_task(self._complete(conn, request))
        elif path == b"/v1/models" and request.method == b"GET":
            conn.respond(200, self._models())
        elif path == b"/health":
            ready = self.registry.ready()
            conn.respond(200 if ready else 503, b"{}" if ready else handshake.error_body(503, "not ready"))
        else:
            conn.respond(404, handshake.error_body(404, f"no route for {request.method.decode()} {path.decode()}"))

    def _models(self) -> bytes:
        view = self.registry.view
        model = view.model if view is not None else ""
        data = [{"id": model, "object": "model", "owned_by": "pdfleet"}] if model else []
        return json.dumps({"object": "list", "data": data}).encode()

    def _fail(self, conn: ClientConnection, path_label: str, status: int, message: str) -> None:
        self.metrics.requests[(path_label, status)] += 1
        conn.respond(status, handshake.error_body(status, message))

    # -- one completion request -----------------------------------------------------------------------------------
    async def _complete(self, conn: ClientConnection, request: Request) -> None:
        view = self.registry.view
        if view is None:
            return self._fail(conn, DIRECT, 503, "router has no fleet view loaded yet")
        try:
            body = json.loads(request.body.decode())
        except ValueError as exc:  # UnicodeDecodeError included
            return self._fail(conn, DIRECT, 400, f"request body is not valid JSON: {exc}")
        if not isinstance(body, dict):
            return self._fail(conn, DIRECT, 400, "request body must be a JSON object")
        rules = view.policy
        prompt = policy.prompt_of(body)
        request_id = request.request_id or b"%s-%d" % (self._id_prefix, next(self._ids))
        estimate = policy.estimate_prompt_tokens(body, prompt)
        if not policy.should_disaggregate(estimate, rules.disaggregate_min_prompt_tokens):
            return await self._direct(conn, request, request_id, DIRECT)
        hashes = policy.prefix_block_hashes(prompt, rules.prefix_block_tokens) if rules.prefix_affinity else ()
        prefilled = await self._prefill(conn, request, body, request_id, hashes)
        if prefilled is None:
            return None
        if prefilled is FALLBACK:
            return await self._direct(conn, request, request_id, FALLBACK)
        prefill, kv_params = prefilled
        stage2 = handshake.decode_request_body(request.body, body, kv_params)
        return await self._decode(conn, request, request_id, prefill, stage2)

    async def _prefill(
        self, conn: ClientConnection, request: Request, body: dict[str, Any], request_id: bytes, hashes: tuple[int, ...]
    ) -> tuple[EndpointState, bytes] | str | None:
        """Stage 1 with retries: (prefill, kv_transfer_params), FALLBACK, or None once the client has its answer."""
        rules = self.registry.view.policy
        stage1 = handshake.prefill_request_body(body)
        affinity = self.affinity.lookup(hashes) if hashes else None

        def pick(tried: set[str]) -> EndpointState | None:
            return policy.choose_prefill(self.registry.prefills, tried, affinity, next(self._tick))

        async def attempt(prefill: EndpointState) -> tuple[Outcome, tuple[CollectSink, bytes | None]]:
            reply = await self._collect(conn, prefill, request.path, request_id, stage1, rules.prefill_timeout_seconds)
            outcome = outcome_of_error(reply.error) if reply.error else outcome_of_status(reply.status)
            kv_params = None
            if outcome is Outcome.OK:
                kv_params = handshake.kv_transfer_params_json(reply.body)
                if kv_params is None:
                    outcome = Outcome.BAD_HANDSHAKE
                    self.metrics.kv_handshake_failures["prefill_missing_params"] += 1
            return outcome, (reply, kv_params)

        decide = partial(failover.after_prefill, max_retries=rules.max_prefill_retries)
        ended = await Retries("prefill", decide, self.metrics).run(pick, attempt)
        if ended is None:
            return FALLBACK
        prefill, (reply, kv_params), decision = ended
        if decision.action is Action.DONE:
            if hashes:
                self.affinity.record(hashes, prefill.name)
            return prefill, kv_params
        if decision.action is Action.PASS_THROUGH:
            self.metrics.requests[(DISAGGREGATED, reply.status)] += 1
            conn.respond(reply.status, reply.body, reply.content_type or _JSON)
            return None
        if decision.action is Action.ABANDON:
            conn.finish(keep_alive=False)
            return None
        return FALLBACK

    async def _decode(
        self, conn: ClientConnection, request: Request, request_id: bytes, prefill: EndpointState, stage2: bytes
    ) -> None:
        """Stage 2 with retries on other decodes, then fallback to the direct path."""
        rules = self.registry.view.policy

        def pick(tried: set[str]) -> EndpointState | None:
            return policy.choose_decode(self.registry.decodes, prefill, rules.locality, tried, next(self._tick))[0]

        async def attempt(decode: EndpointState) -> tuple[Outcome, StreamSink]:
            locality = policy.locality_of(prefill, decode)  # the class choose_decode just picked it by
            sink = await self._stream(conn, decode, request, request_id, stage2, rules.decode_timeout_seconds)
            if sink.outcome is Outcome.OK:
                self.metrics.pairs[locality] += 1
            elif sink.outcome in (Outcome.UPSTREAM_5XX, Outcome.TIMEOUT):
                self.metrics.kv_handshake_failures["decode_" + sink.outcome.value] += 1
            return sink.outcome, sink

        decide = partial(failover.after_decode, max_retries=rules.max_decode_retries, can_fall_back=True)
        retries = Retries("decode", decide, self.metrics)
        ended = await retries.run(pick, attempt)
        if ended is None:
            if rules.locality == "required" and not retries.tried:
                return self._fail(
                    conn,
                    DISAGGREGATED,
                    503,
                    f"decode leg: no healthy decode endpoint in rack {prefill.rack!r} (locality: required)",
                )
        else:
            _, sink, decision = ended
            if decision.action is not Action.FALLBACK:
                return self._conclude(conn, sink, DISAGGREGATED, decision.action)
        return await self._direct(conn, request, request_id, FALLBACK)

    async def _direct(self, conn: ClientConnection, request: Request, request_id: bytes, path_label: str) -> None:
        """Whole request on one decode instance: short prompts, and the fallback of failed PD attempts."""
        rules = self.registry.view.policy
        if path_label == FALLBACK:
            self.metrics.fallbacks += 1

        def pick(tried: set[str]) -> EndpointState | None:
            return policy.choose_direct_decode(self.registry.decodes, tried, next(self._tick))

        async def attempt(decode: EndpointState) -> tuple[Outcome, StreamSink]:
            sink = await self._stream(conn, decode, request, request_id, request.body, rules.decode_timeout_seconds)
            return sink.outcome, sink

        decide = partial(failover.after_decode, max_retries=rules.max_decode_retries, can_fall_back=False)
        retries = Retries("decode", decide, self.metrics)
        ended = await retries.run(pick, attempt)
        if ended is None:
            tried = f" (tried {', '.join(sorted(retries.tried))})" if retries.tried else ""
            return self._fail(conn, path_label, 503, f"{path_label} leg: no healthy decode endpoint{tried}")
        decode, sink, decision = ended
        if decision.action is Action.FAIL:
            return self._fail(
                conn, path_label, decision.status, f"{path_label} leg failed on decode {decode.name}: {sink.error}"
            )
        return self._conclude(conn, sink, path_label, decision.action)

    def _conclude(self, conn: ClientConnection, sink: StreamSink, path_label: str, action: Action) -> None:
        """Finish the client response after a decode leg ended for good."""
        metrics = self.metrics
        if action is Action.DONE:
            metrics.requests[(path_label, sink.status)] += 1
            if sink.events:
                metrics.ttft.observe(sink.t_first - conn.current.received_at if conn.current else 0.0)
                if sink.events > 1:
                    metrics.tpot.observe((sink.t_last - sink.t_first) / (sink.events - 1))
            conn.finish()
        elif action is Action.PASS_THROUGH:
            metrics.requests[(path_label, sink.status)] += 1
            conn.respond(sink.status, sink.body, sink.content_type)
        elif sink.outcome is Outcome.DIED_MID_STREAM:
            metrics.requests[(path_label, 502)] += 1
            if conn.closed:
                return
            if sink.chunked and sink.content_type.startswith(_SSE):
                event = handshake.sse_error_event(f"decode leg failed mid-stream ({path_label} path): {sink.error}")
                conn.write(b"%x\r\n%b\r\n%s" % (len(event), event, _LAST_CHUNK))
                conn.finish(keep_alive=False)
            else:
                conn.close()  # a half-sent JSON body cannot carry an error: a cut connection tells the client
        else:  # the client went away
            metrics.requests[(path_label, 499)] += 1
            conn.finish(keep_alive=False)

    # -- legs -----------------------------------------------------------------------------------------------------
    async def _collect(
        self,
        conn: ClientConnection,
        endpoint: EndpointState,
        path: bytes,
        request_id: bytes,
        body: bytes,
        timeout: float,
    ) -> CollectSink:
        """A leg whose whole (small) reply is needed: the prefill stage."""
        sink = CollectSink(self.loop)
        await self._run_leg(conn, endpoint, path, request_id, body, timeout, sink)
        return sink

    async def _stream(
        self,
        conn: ClientConnection,
        endpoint: EndpointState,
        request: Request,
        request_id: bytes,
        body: bytes,
        timeout: float,
    ) -> StreamSink:
        """A leg whose reply goes to the client as it comes: the decode stage and the direct path."""
        sink = StreamSink(conn, self.loop)
        await self._run_leg(conn, endpoint, request.path, request_id, body, timeout, sink)
        return sink

    async def _run_leg(
        self,
        conn: ClientConnection,
        endpoint: EndpointState,
        path: bytes,
        request_id: bytes,
        body: bytes,
        timeout: float,
        sink: CollectSink | StreamSink,
    ) -> None:
        if conn.closed:
            sink.on_failure(UpstreamError(ABORTED, "client disconnected"))
            return
        endpoint.inflight += 1
        try:
            wire = b"%s%s\r\nContent-Length: %d\r\n\r\n%s" % (endpoint.post_head(path), request_id, len(body), body)
            upstream = endpoint.pool.send_now(wire, sink, timeout) or await endpoint.pool.send(wire, sink, timeout)
            if upstream is not None:
                if conn.closed:
                    upstream.abort()
                else:
                    conn.upstream = upstream
                    if conn.paused:
                        upstream.pause_reading()
            await sink.done
        finally:
            conn.upstream = None
            self.registry.leg_done(endpoint)
