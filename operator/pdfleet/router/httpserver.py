"""Lean HTTP/1.1 server side: an asyncio Protocol with httptools, keep-alive, precomputed response heads.

The application gets each complete request with `handle(conn, request)` and answers through the connection's write
methods; requests pipelined on one connection are answered in order.

Limits (`ServerLimits`, router flags): a request whose request line, header block or body is too large is refused as
soon as the excess arrives (414, 431, 413; a declared Content-Length above the limit before any body byte is read,
a chunked body as it is counted), as is one whose head or body does not arrive within its timeout (408), and a request
httptools cannot parse (400). A refusal is a JSON error with `Connection: close`, after any responses still owed on
the connection; the server then stops reading the request and closes (it discards what the client still sends for
up to LINGER_SECONDS, so the client can read the refusal). A connection that opens and sends nothing is closed after
the header timeout, one idle between requests after the idle timeout. One sweep per listener checks every
connection's read deadline a few times a second, so keeping deadlines costs a request only a few attribute stores.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Callable, Protocol

import httptools

log = logging.getLogger("pdfleet.router")
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
MAX_PIPELINED = 16  # parsed requests waiting behind the one being answered; the connection stops reading beyond this
LINGER_SECONDS = 2.0  # after a refusal: how long the rest of the client's request is read and discarded
_HEAD_SLACK = 1024  # request line + header block bytes beyond the two limits tolerated while the head is incomplete
# what a connection's read deadline is for
_FRESH, _HEAD, _BODY, _IDLE = "fresh", "head", "body", "idle"


@dataclass(frozen=True)
class ServerLimits:
    """Limits of one listener's client connections (router flags --max-body-bytes ... --idle-timeout)."""

    max_body_bytes: int = 8 << 20  # request body (413)
    max_header_bytes: int = 16 << 10  # header block, every `name: value` line (431)
    max_request_line_bytes: int = 8 << 10  # request target (414)
    header_timeout_seconds: float = 10.0  # from a request's first byte (or the connection's opening) to its last header
    body_timeout_seconds: float = 60.0  # from the end of the head to the end of the body
    idle_timeout_seconds: float = 60.0  # a kept-alive connection with no request under way

    def sweep_interval(self) -> float:
        """How often the listener checks its connections' read deadlines."""
        shortest = min(self.header_timeout_seconds, self.body_timeout_seconds, self.idle_timeout_seconds)
        return max(0.05, min(1.0, shortest / 4))


class _Refusal(Exception):
    """Raised inside a parser callback to stop reading a request and refuse it."""

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason  # pdfleet_router_client_rejections_total label


def status_line(status: int) -> bytes:
    """`HTTP/1.1 200 OK\\r\\n` for a status code."""
    return b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))


_HEAD_CACHE: dict[tuple[int, bytes, bool], bytes] = {}


def response_head(status: int, content_type: bytes, chunked: bool) -> bytes:
    """Response head up to (for Content-Length) or including (for chunked) the blank line; cached per shape."""
    key = (status, content_type, chunked)
    head = _HEAD_CACHE.get(key)
    if head is None:
        head = status_line(status) + b"Content-Type: " + content_type + b"\r\n"
        if chunked:
            head += b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
        _HEAD_CACHE[key] = head
    return head


class Request:
    """One complete client request."""

    __slots__ = ("method", "path", "body", "request_id", "keep_alive", "received_at", "content_type", "authorization")

    def __init__(
        self,
        method: bytes,
        path: bytes,
        body: bytes,
        request_id: bytes | None,
        keep_alive: bool,
        received_at: float,
        content_type: bytes | None = None,
        authorization: bytes | None = None,
    ) -> None:
        self.method = method
        self.path = path
        self.body = body
        self.request_id = request_id
        self.keep_alive = keep_alive
        self.received_at = received_at
        self.content_type = content_type  # the Content-Type header's value, None without one
        self.authorization = authorization  # the Authorization header's value, None without one


class Application(Protocol):
    """Something that answers requests."""

    def handle(self, conn: ClientConnection, request: Request) -> None:
        """Serve one parsed request on its connection."""


class ClientConnection(asyncio.Protocol):
    """Server side of one client connection."""

    __slots__ = (
        "app",
        "loop",
        "transport",
        "parser",
        "closed",
        "busy",
        "pending",
        "upstream",
        "current",
        "paused",
        "written",
        "limits",
        "sweeper",
        "refused",
        "_url",
        "_body",
        "_request_id",
        "_content_type",
        "_authorization",
        "_content_length",
        "_continue",
        "_now",
        "_deadline",
        "_deadline_kind",
        "_reading",
        "_in_head",
        "_head_bytes",
        "_head_bound",
        "_header_bytes",
        "_body_bytes",
        "_refusal",
        "_read_paused",
        "_linger",
    )

    def __init__(
        self,
        app: Application,
        loop: asyncio.AbstractEventLoop,
        limits: ServerLimits,
        sweeper: _Sweeper | None = None,
    ) -> None:
        self.app = app
        self.loop = loop
        self.limits = limits
        self.sweeper = sweeper
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self.busy = False
        self.pending: deque[Request] = deque()
        self.upstream: Any = None  # the upstream connection now feeding this client (for cancel and flow control)
        self.current: Request | None = None
        self._url = b""
        self._body: list[bytes] = []
        self._request_id: bytes | None = None
        self.paused = False  # the client's socket buffer is full: upstream reading is paused too
        self.refused = False  # a request was refused: what the client still sends is discarded
        self.written = False  # bytes of the current response were written
        self._content_type: bytes | None = None
        self._authorization: bytes | None = None
        self._content_length: bytes | None = None
        self._continue = False  # the client sent Expect: 100-continue
        self._now = 0.0  # loop time of the read being parsed
        self._deadline = 0.0  # loop time by which the read under way must be done; 0: none (a response is due)
        self._deadline_kind = _FRESH
        self._reading = False  # between a request's first byte and its end
        self._in_head = True  # before the end of a request head: raw bytes are counted against the head limits
        self._head_bytes = 0
        self._head_bound = limits.max_request_line_bytes + limits.max_header_bytes + _HEAD_SLACK
        self._header_bytes = 0
        self._body_bytes = 0
        self._refusal: _Refusal | None = None  # a refusal waiting for the responses owed before it
        self._read_paused = False  # too many pipelined requests wait: reading is paused
        self._linger: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol -----------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # noqa: D102
        self.transport = transport  # type: ignore[assignment]
        self._deadline = self.loop.time() + self.limits.header_timeout_seconds
        if self.sweeper is not None:
            self.sweeper.add(self)

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102
        self.closed = True
        self.pending.clear()
        if self.sweeper is not None:
            self.sweeper.discard(self)
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            upstream.abort()

    def data_received(self, data: bytes) -> None:  # noqa: D102
        if self.refused:
            return  # lingering after a refusal
        if self._in_head:
            self._head_bytes += len(data)
        self._now = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.close()
            return
        except httptools.HttpParserError as exc:
            self._parse_failed(exc)
            return
        if self._in_head and self._head_bytes > self._head_bound:  # one huge header line, still incomplete
            limit = self.limits.max_header_bytes
            self._refuse(_Refusal(431, f"request header block larger than {limit} bytes", "header_too_large"))

    def _parse_failed(self, exc: httptools.HttpParserError) -> None:
        cause = exc.__context__
        if isinstance(cause, _Refusal):
            self._refuse(cause)
        elif cause is None or isinstance(cause, httptools.HttpParserError):
            self._refuse(_Refusal(400, f"malformed HTTP request: {exc}", "bad_request"))
        else:
            # the application raised while handling the request it was just given: it sends nothing more for it
            self.busy = False
            if isinstance(cause, RecursionError):  # e.g. json.loads of a deeply nested body
                self._refuse(_Refusal(400, "request body nested too deeply", "bad_request"))
            else:
                log.error("unhandled error serving %s", self._url[:200].decode(errors="replace"), exc_info=cause)
                self._refuse(_Refusal(500, "internal error of the router", "internal_error"))

    def pause_writing(self) -> None:  # noqa: D102
        self.paused = True
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:  # noqa: D102
        self.paused = False
        if self.upstream is not None:
            self.upstream.resume_reading()

    # -- httptools callbacks --------------------------------------------------------------------------------------
    def on_message_begin(self) -> None:  # noqa: D102
        self._url = b""
        self._body = []
        self._request_id = None
        self._content_type = None
        self._authorization = None
        self._content_length = None
        self._continue = False
        self._header_bytes = 0
        self._body_bytes = 0
        self._reading = True
        self._deadline = self._now + self.limits.header_timeout_seconds
        self._deadline_kind = _HEAD

    def on_url(self, url: bytes) -> None:  # noqa: D102
        self._url += url
        if len(self._url) > self.limits.max_request_line_bytes:
            limit = self.limits.max_request_line_bytes
            raise _Refusal(414, f"request line longer than {limit} bytes", "request_line_too_long")

    def on_header(self, name: bytes, value: bytes) -> None:  # noqa: D102
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > self.limits.max_header_bytes:
            limit = self.limits.max_header_bytes
            raise _Refusal(431, f"request header block larger than {limit} bytes", "header_too_large")
        size = len(name)
        if size == 12:
            lname = name.lower()
            if lname == b"content-type":
                self._content_type = value
            elif lname == b"x-request-id":
                self._request_id = value
        elif size == 14 and name.lower() == b"content-length":
            self._content_length = value
        elif size == 13 and name.lower() == b"authorization":
            self._authorization = value
        elif size == 6 and name.lower() == b"expect" and value.lower() == b"100-continue":
            self._continue = True

    def on_headers_complete(self) -> None:  # noqa: D102
        self._in_head = False
        self._head_bytes = 0
        limit = self.limits.max_body_bytes
        if self._content_length is not None:
            try:
                declared = int(self._content_length)
            except ValueError:
                raise _Refusal(400, "malformed Content-Length", "bad_request") from None
            if declared > limit:
                raise _Refusal(413, f"request body larger than {limit} bytes", "body_too_large")
        if self._continue and not self.busy:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits a second for it on large bodies
        self._deadline = self._now + self.limits.body_timeout_seconds
        self._deadline_kind = _BODY

    def on_body(self, body: bytes) -> None:  # noqa: D102
        self._body_bytes += len(body)
        if self._body_bytes > self.limits.max_body_bytes:  # a chunked body, counted as it comes
            limit = self.limits.max_body_bytes
            raise _Refusal(413, f"request body larger than {limit} bytes", "body_too_large")
        self._body.append(body)

    def on_message_complete(self) -> None:  # noqa: D102
        body = self._body
        path = self._url
        query = path.find(b"?")
        request = Request(
            self.parser.get_method(),
            path if query < 0 else path[:query],
            body[0] if len(body) == 1 else b"".join(body),
            self._request_id,
            self.parser.should_keep_alive(),
            self._now,
            self._content_type,
            self._authorization,
        )
        self._body = []
        self._reading = False
        self._in_head = True
        self._head_bytes = 0
        self._deadline = 0.0
        if self.busy:
            self.pending.append(request)
            if len(self.pending) >= MAX_PIPELINED and not self._read_paused:
                self._read_paused = True
                self.transport.pause_reading()
        else:
            self._start(request)

    # -- responding -----------------------------------------------------------------------------------------------
    def _start(self, request: Request) -> None:
        self.busy = True
        self.current = request
        self.written = False
        self.app.handle(self, request)

    def write(self, data: bytes) -> None:
        """Write raw bytes to the client (no-op once the client is gone)."""
        if not self.closed:
            self.written = True
            self.transport.write(data)

    def finish(self, keep_alive: bool = True) -> None:
        """The current response is complete: serve the next pipelined request, or close."""
        self.upstream = None
        if self.closed:
            return
        if not (keep_alive and self.current is not None and self.current.keep_alive):
            self.close()
            return
        self.busy = False
        self.current = None
        if self.pending:
            if self._read_paused and len(self.pending) <= MAX_PIPELINED // 2 and self._refusal is None:
                self._read_paused = False
                self.transport.resume_reading()
            self._start(self.pending.popleft())
        elif self._refusal is not None:
            self._send_refusal(self._refusal)
        elif not self._reading:
            self._deadline = self.loop.time() + self.limits.idle_timeout_seconds
            self._deadline_kind = _IDLE

    def respond(self, status: int, body: bytes, content_type: bytes = b"application/json") -> None:
        """Write a whole Content-Length response and finish."""
        self.write(response_head(status, content_type, False) + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        self.finish()

    def close(self) -> None:
        """Close the client connection after what was written is flushed."""
        if not self.closed:
            self.closed = True
            self.transport.close()

    # -- limits ---------------------------------------------------------------------------------------------------
    def read_timed_out(self) -> None:
        """The read under way missed its deadline (called by the listener's sweep)."""
        kind = self._deadline_kind
        self._deadline = 0.0
        if kind is _FRESH or kind is _IDLE:
            self.close()  # nothing was asked: nothing to answer
        elif kind is _HEAD:
            timeout = self.limits.header_timeout_seconds
            self._refuse(_Refusal(408, f"request head not received within {timeout:g}s", "header_timeout"))
        else:
            timeout = self.limits.body_timeout_seconds
            self._refuse(_Refusal(408, f"request body not received within {timeout:g}s", "body_timeout"))

    def _refuse(self, refusal: _Refusal) -> None:
        """Stop reading requests and refuse the one under way, once the responses owed before it are sent."""
        if self.refused or self.closed:
            return
        self.refused = True
        self._deadline = 0.0
        counter = getattr(self.app, "client_rejected", None)
        if counter is not None:
            counter(refusal.reason)
        if self.busy:
            self._refusal = refusal
            self.transport.pause_reading()
        else:
            self._send_refusal(refusal)

    def _send_refusal(self, refusal: _Refusal) -> None:
        body = json.dumps({"error": {"message": str(refusal), "type": "router_error", "code": refusal.status}}).encode()
        self.transport.write(
            status_line(refusal.status)
            + b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
        )
        self.closed = True
        self.pending.clear()
        transport = self.transport
        if transport.can_write_eof():
            # half-close and drain what the client still sends, so that it can read the refusal before the socket
            # closes (closing with unread bytes would reset the connection and could destroy the reply)
            transport.write_eof()
            transport.resume_reading()
            self._linger = self.loop.call_later(LINGER_SECONDS, transport.close)
        else:
            transport.close()


class _Sweeper:
    """Checks the read deadlines of one listener's connections every `interval` seconds while it has any."""

    __slots__ = ("loop", "interval", "conns", "handle")

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float) -> None:
        self.loop = loop
        self.interval = interval
        self.conns: set[ClientConnection] = set()
        self.handle: asyncio.TimerHandle | None = None

    def add(self, conn: ClientConnection) -> None:
        """Watch a new connection."""
        self.conns.add(conn)
        if self.handle is None:
            self.handle = self.loop.call_later(self.interval, self._sweep)

    def discard(self, conn: ClientConnection) -> None:
        """Stop watching a closed connection."""
        self.conns.discard(conn)

    def _sweep(self) -> None:
        self.handle = None
        now = self.loop.time()
        for conn in [c for c in self.conns if c._deadline and now >= c._deadline]:
            conn.read_timed_out()
        if self.conns:
            self.handle = self.loop.call_later(self.interval, self._sweep)


async def serve(app: Application, host: str, port: int, limits: ServerLimits) -> asyncio.base_events.Server:
    """Listen on host:port and serve `app` within `limits`."""
    loop = asyncio.get_running_loop()
    sweeper = _Sweeper(loop, limits.sweep_interval())
    factory: Callable[[], ClientConnection] = lambda: ClientConnection(app, loop, limits, sweeper)  # noqa: E731
    return await loop.create_server(factory, host, port, backlog=1024, reuse_address=True)
