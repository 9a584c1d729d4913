"""The data path: OpenAI-compatible front door running vLLM's two-stage PD handshake with bounded failover.

Per request: JSON is parsed once; the prefill leg's small reply is collected; the decode leg's reply is forwarded from
the upstream socket callbacks straight to the client socket (HTTP chunks re-framed, SSE bytes untouched).

No body goes to an engine with a client's engine-internal fields (handshake.INTERNAL_FIELDS). Each leg has a first-byte
and (decode, direct) an inter-chunk timeout from the policy; a leg that misses one on an endpoint no other leg got bytes
from lately takes that endpoint out until its hold-out ends (EndpointRegistry.leg_timed_out).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
from functools import partial
from typing import Any, Awaitable, Callable, Generic, TypeVar

from . import failover, handshake, policy
from .endpoints import EndpointRegistry, EndpointState
from .failover import Action, Decision, Outcome
from .httpclient import ABORTED, PROTOCOL, TIMEOUT, CollectSink, UpstreamConnection, UpstreamError
from .httpserver import ClientConnection, Request, response_head
from .metrics import RouterMetrics

log = logging.getLogger("pdfleet.router")
COMPLETION_PATHS = frozenset({b"/v1/completions", b"/v1/chat/completions"})
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's max_tokens of a /v1/completions request that sets none
DISAGGREGATED, DIRECT, FALLBACK = "disaggregated", "direct", "fallback"
_JSON = b"application/json"
_SSE = b"text/event-stream"
_LAST_CHUNK = b"0\r\n\r\n"
_BAD_PROMPT = "request body: the prompt must be a string, a list of token ids, or a batch of either"


def is_json_media_type(content_type: bytes) -> bool:
    """application/json or application/<anything>+json, any parameters (charset) ignored."""
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == _JSON or (media.startswith(b"application/") and media.endswith(b"+json"))


def requested_tokens(body: dict[str, Any], path: bytes) -> object:
    """The most tokens a request may generate, as it says (None when it leaves that to the engine)."""
    tokens = body.get("max_completion_tokens")
    if tokens is None:
        tokens = body.get("max_tokens")
    if tokens is None and path == b"/v1/completions":
        return COMPLETIONS_DEFAULT_MAX_TOKENS
    return tokens


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
        "timed_out",
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
        self.timed_out = ""  # which deadline the leg missed (httpclient FIRST_BYTE, INTER_CHUNK, TOTAL)

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
        if error.kind == TIMEOUT:
            self.timed_out = error.reason
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
            content_type = request.content_type
            if content_type is not None and content_type != _JSON and not is_json_media_type(content_type):
                media = content_type.decode(errors="replace")[:100]
                return self._fail(conn, DIRECT, 415, f"request body must be application/json, got {media!r}")
            self.loop.create_task(self._complete(conn, request))
        elif path == b"/v1/models" and request.method == b"GET":
            conn.respond(200, self._models())
        elif path == b"/health":
            ready = self.registry.ready()
            conn.respond(200 if ready else 503, b"{}" if ready else handshake.error_body(503, "not ready"))
        else:
            route = f"{request.method.decode(errors='replace')} {path.decode(errors='replace')[:200]}"
            conn.respond(404, handshake.error_body(404, f"no route for {route}"))

    def client_rejected(self, reason: str) -> None:
        """The HTTP server refused a request (a limit, a timeout, a parse error): count it."""
        self.metrics.client_rejections[reason] += 1

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
        try:
            await self._serve_completion(conn, request)
        except Exception:  # a bug must cost one request an error reply, not its connection a hang
            log.exception("unhandled error serving a %s request", request.path.decode(errors="replace"))
            if conn.closed or conn.current is not request:
                return
            if conn.written:
                conn.close()
            else:
                self._fail(conn, DIRECT, 500, "internal error of the router")

    async def _serve_completion(self, conn: ClientConnection, request: Request) -> None:
        view = self.registry.view
        if view is None:
            return self._fail(conn, DIRECT, 503, "router has no fleet view loaded yet")
        try:
            body = json.loads(request.body.decode())
        except ValueError as exc:  # UnicodeDecodeError included
            return self._fail(conn, DIRECT, 400, f"request body is not valid JSON: {exc}")
        except RecursionError:
            return self._fail(conn, DIRECT, 400, "request body is not valid JSON: nested too deeply")
        if not isinstance(body, dict):
            return self._fail(conn, DIRECT, 400, "request body must be a JSON object")
        rules = view.policy
        try:
            prompt = policy.prompt_of(body)
            estimate = policy.estimate_prompt_tokens(body, prompt)
            disaggregate = policy.should_disaggregate(
                estimate, rules.disaggregate_min_prompt_tokens, self.registry.prefills
            )
            hashes = (
                policy.prefix_block_hashes(prompt, rules.prefix_block_tokens)
                if disaggregate and rules.prefix_affinity
                else ()
            )
        except (TypeError, ValueError, RecursionError):  # e.g. unhashable blocks of a malformed prompt
            return self._fail(conn, DIRECT, 400, _BAD_PROMPT)
        request_id = request.request_id or b"%s-%d" % (self._id_prefix, next(self._ids))
        first_byte = failover.first_byte_timeout(
            rules.first_byte_timeout_seconds,
            rules.inter_chunk_timeout_seconds,
            bool(body.get("stream")),
            requested_tokens(body, request.path),
        )
        if not disaggregate:
            direct_body = handshake.direct_request_body(request.body, body)
            return await self._direct(conn, request, request_id, DIRECT, direct_body, first_byte)
        prefilled = await self._prefill(conn, request, body, request_id, hashes)
        if prefilled is None:
            return None
        if prefilled is FALLBACK:
            direct_body = handshake.direct_request_body(request.body, body)
            return await self._direct(conn, request, request_id, FALLBACK, direct_body, first_byte)
        prefill, kv_params = prefilled
        stage2 = handshake.decode_request_body(request.body, body, kv_params)
        return await self._decode(conn, request, body, request_id, prefill, stage2, first_byte)

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
            reply = await self._collect(
                conn,
                prefill,
                request.path,
                request_id,
                stage1,
                rules.prefill_timeout_seconds,
                rules.first_byte_timeout_seconds,
            )
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
        self,
        conn: ClientConnection,
        request: Request,
        body: dict[str, Any],
        request_id: bytes,
        prefill: EndpointState,
        stage2: bytes,
        first_byte: float,
    ) -> None:
        """Stage 2 with retries on other decodes, then fallback to the direct path."""
        rules = self.registry.view.policy

        def pick(tried: set[str]) -> EndpointState | None:
            return policy.choose_decode(self.registry.decodes, prefill, rules.locality, tried, next(self._tick))[0]

        async def attempt(decode: EndpointState) -> tuple[Outcome, StreamSink]:
            locality = policy.locality_of(prefill, decode)  # the class choose_decode just picked it by
            sink = await self._stream(
                conn, decode, request, request_id, stage2, rules.decode_timeout_seconds, first_byte
            )
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
        direct_body = handshake.direct_request_body(request.body, body)
        return await self._direct(conn, request, request_id, FALLBACK, direct_body, first_byte)

    async def _direct(
        self,
        conn: ClientConnection,
        request: Request,
        request_id: bytes,
        path_label: str,
        direct_body: bytes,
        first_byte: float,
    ) -> None:
        """Whole request on one decode instance: short prompts, and the fallback of failed PD attempts.
        `direct_body` is the client's request without engine-internal fields."""
        rules = self.registry.view.policy
        if path_label == FALLBACK:
            self.metrics.fallbacks += 1

        def pick(tried: set[str]) -> EndpointState | None:
            return policy.choose_direct_decode(self.registry.decodes, tried, next(self._tick))

        async def attempt(decode: EndpointState) -> tuple[Outcome, StreamSink]:
            sink = await self._stream(
                conn, decode, request, request_id, direct_body, rules.decode_timeout_seconds, first_byte
            )
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
        first_byte: float,
    ) -> CollectSink:
        """A leg whose whole (small) reply is needed: the prefill stage."""
        sink = CollectSink(self.loop)
        await self._run_leg(conn, endpoint, path, request_id, body, timeout, sink, first_byte, 0.0)
        return sink

    async def _stream(
        self,
        conn: ClientConnection,
        endpoint: EndpointState,
        request: Request,
        request_id: bytes,
        body: bytes,
        timeout: float,
        first_byte: float,
    ) -> StreamSink:
        """A leg whose reply goes to the client as it comes: the decode stage and the direct path."""
        sink = StreamSink(conn, self.loop)
        idle = self.registry.view.policy.inter_chunk_timeout_seconds
        await self._run_leg(conn, endpoint, request.path, request_id, body, timeout, sink, first_byte, idle)
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
        first_byte: float,
        idle: float,
    ) -> None:
        """One exchange with an endpoint. `timeout` bounds the whole reply, `first_byte` the wait for its first body
        byte and `idle` any silence once the body started (0: no such bound)."""
        if conn.closed:
            sink.on_failure(UpstreamError(ABORTED, "client disconnected"))
            return
        endpoint.inflight += 1
        try:
            wire = b"%s%s\r\nContent-Length: %d\r\n\r\n%s" % (endpoint.post_head(path), request_id, len(body), body)
            pool = endpoint.pool
            upstream = pool.send_now(wire, sink, timeout, first_byte, idle) or await pool.send(
                wire, sink, timeout, first_byte, idle
            )
            if upstream is not None:
                if conn.closed:
                    upstream.abort()
                else:
                    conn.upstream = upstream
                    if conn.paused:
                        upstream.pause_reading()
            await sink.done
            if sink.timed_out:
                self._leg_timed_out(endpoint, sink.timed_out)
        finally:
            conn.upstream = None
            self.registry.leg_done(endpoint)

    def _leg_timed_out(self, endpoint: EndpointState, reason: str) -> None:
        self.metrics.upstream_timeouts[(endpoint.pool_name, reason)] += 1
        window = self.registry.view.policy.inter_chunk_timeout_seconds  # bytes this recent: busy, not hung
        self.registry.leg_timed_out(endpoint, self.loop.time(), window)
