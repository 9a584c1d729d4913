"""Lean HTTP/1.1 server side: an asyncio Protocol with httptools, keep-alive, precomputed response heads.

The application gets each complete request with `handle(conn, request)` and answers through the connection's write
methods; requests pipelined on one connection are answered in order.
"""

from __future__ import annotations

import asyncio
from collections import deque
from http import HTTPStatus
from typing import Any, Callable, Protocol

import httptools

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


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

    __slots__ = ("method", "path", "body", "request_id", "keep_alive", "received_at")

    def __init__(
        self, method: bytes, path: bytes, body: bytes, request_id: bytes | None, keep_alive: bool, received_at: float
    ) -> None:
        self.method = method
        self.path = path
        self.body = body
        self.request_id = request_id
        self.keep_alive = keep_alive
        self.received_at = received_at


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
        "_url",
        "_body",
        "_request_id",
    )

    def __init__(self, app: Application, loop: asyncio.AbstractEventLoop) -> None:
        self.app = app
        self.loop = loop
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

    # -- asyncio.Protocol -----------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # noqa: D102
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102
        self.closed = True
        self.pending.clear()
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            upstream.abort()

    def data_received(self, data: bytes) -> None:  # noqa: D102
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.close()
        except httptools.HttpParserError:
            self.transport.write(status_line(400) + b"Content-Length: 0\r\nConnection: close\r\n\r\n")
            self.close()

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

    def on_url(self, url: bytes) -> None:  # noqa: D102
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:  # noqa: D102
        if len(name) == 12 and name.lower() == b"x-request-id":
            self._request_id = value
        elif len(name) == 6 and name.lower() == b"expect" and value.lower() == b"100-continue":
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits a second for it on large bodies

    def on_body(self, body: bytes) -> None:  # noqa: D102
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
            self.loop.time(),
        )
        if self.busy:
            self.pending.append(request)
        else:
            self._start(request)

    # -- responding -----------------------------------------------------------------------------------------------
    def _start(self, request: Request) -> None:
        self.busy = True
        self.current = request
        self.app.handle(self, request)

    def write(self, data: bytes) -> None:
        """Write raw bytes to the client (no-op once the client is gone)."""
        if not self.closed:
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
            self._start(self.pending.popleft())

    def respond(self, status: int, body: bytes, content_type: bytes = b"application/json") -> None:
        """Write a whole Content-Length response and finish."""
        self.write(response_head(status, content_type, False) + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        self.finish()

    def close(self) -> None:
        """Close the client connection after what was written is flushed."""
        if not self.closed:
            self.closed = True
            self.transport.close()


async def serve(app: Application, host: str, port: int) -> asyncio.base_events.Server:
    """Listen on host:port and serve `app`."""
    loop = asyncio.get_running_loop()
    factory: Callable[[], ClientConnection] = lambda: ClientConnection(app, loop)  # noqa: E731
    return await loop.create_server(factory, host, port, backlog=1024, reuse_address=True)
