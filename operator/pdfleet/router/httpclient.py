"""Minimal keep-alive HTTP/1.1 client for upstream legs: asyncio Protocol + httptools, callbacks straight to a sink.

A sink receives the response as it is parsed (head, body pieces, end of one socket read, completion or failure), so a
streaming reply goes from the upstream socket to the client socket without a task switch or a queue in between.
Content-Length and chunked bodies are both handled by httptools.

Each exchange has an overall timeout and, for the router's legs, a first-byte timeout (until the first body byte of the
reply) and an inter-chunk timeout (the longest the reply may stay silent once its body started). One timer per
exchange checks all three: a socket read only records its time, and the timer re-arms itself when it fires early.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import httptools

CONNECT_FAILED, RESET, TIMEOUT, PROTOCOL, ABORTED = "connect_failed", "reset", "timeout", "protocol", "aborted"
# which deadline a TIMEOUT missed (UpstreamError.reason)
FIRST_BYTE, INTER_CHUNK, TOTAL = "first_byte", "inter_chunk", "total"
_EARLY = 0.001  # a timer may fire up to this much before its time (the loop's clock resolution)


class UpstreamError(Exception):
    """A leg failed at the transport level; `kind` is one of the module constants, `started` whether bytes came;
    `reason` which deadline a TIMEOUT missed (FIRST_BYTE, INTER_CHUNK or TOTAL)."""

    def __init__(self, kind: str, message: str, started: bool = False, reason: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.started = started
        self.reason = reason


class ResponseSink(Protocol):
    """Receiver of one upstream response."""

    def on_head(self, status: int, content_type: bytes, content_length: int) -> None:
        """The status line and headers arrived."""

    def on_body(self, data: bytes) -> None:
        """A chunk of the body arrived."""

    def on_batch_end(self) -> None:
        """The bytes of one socket read were delivered (flush point)."""

    def on_complete(self) -> None:
        """The whole response arrived."""

    def on_failure(self, error: UpstreamError) -> None:
        """The exchange failed before completing."""


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to an upstream; carries one exchange at a time."""

    __slots__ = (
        "pool",
        "transport",
        "parser",
        "sink",
        "closed",
        "reused",
        "_request",
        "_timer",
        "_ctype",
        "_clen",
        "_started",
        "_timeout",
        "_paused",
        "_first_byte",
        "_idle",
        "_sent",
        "_deadline",
        "_last",
        "_now",
        "_clock",
    )

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.sink: ResponseSink | None = None
        self.closed = False
        self.reused = False
        self._request = b""
        self._timer: asyncio.TimerHandle | None = None
        self._ctype = b""
        self._clen = -1
        self._started = False
        self._timeout = 0.0
        self._paused = False
        self._first_byte = 0.0  # seconds until the first body byte; 0: no such bound
        self._idle = 0.0  # the longest silence once the body started; 0: no such bound
        self._sent = 0.0  # loop time the request was written
        self._deadline = 0.0  # loop time the whole exchange must be over by
        self._last = 0.0  # loop time of the latest body bytes; 0: none yet
        self._now = 0.0  # loop time of the read being parsed (exchanges with a first-byte or inter-chunk bound)
        self._clock = pool.loop.time

    # -- exchange -------------------------------------------------------------------------------------------------
    def send(
        self, request: bytes, sink: ResponseSink, timeout: float, first_byte: float = 0.0, idle: float = 0.0
    ) -> None:
        """Write a full request and route its response to `sink`; fails the sink (TIMEOUT) after `timeout` seconds,
        or when no body byte came within `first_byte` seconds, or when the body stopped for `idle` seconds (0: no
        such bound)."""
        self.sink = sink
        self._request = request
        self._ctype = b""
        self._clen = -1
        self._started = False
        self._timeout = timeout
        self._first_byte = first_byte
        self._idle = idle
        self._last = 0.0
        now = self._sent = self._clock()
        self._deadline = now + timeout
        # the first check comes at the earliest deadline the exchange could miss: the body may start any time, and
        # once it has, a silence of `idle` seconds must not wait for the first-byte deadline to be noticed
        wait = timeout
        if 0.0 < first_byte < wait:
            wait = first_byte
        if 0.0 < idle < wait:
            wait = idle
        self._timer = self.pool.loop.call_later(wait, self._on_timer)  # uvloop: call_later is cheaper than call_at
        self.transport.write(request)

    def abort(self) -> None:
        """Drop the connection now (client gone, leg cancelled); the sink, if any, hears ABORTED."""
        self._fail(UpstreamError(ABORTED, "upstream leg cancelled", self._started))
        self.close()

    def close(self) -> None:
        """Close without failing an exchange."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def pause_reading(self) -> None:
        """Flow control: stop reading while the client cannot take more."""
        if self.transport is not None and not self.closed and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        """Flow control: resume reading."""
        if self.transport is not None and not self.closed and self._paused:
            self._paused = False
            self.transport.resume_reading()

    def _fail(self, error: UpstreamError) -> None:
        sink = self.sink
        if sink is None:
            return
        self.sink = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        sink.on_failure(error)

    def _on_timer(self) -> None:
        """The exchange's one timer: fail it if a deadline passed, else re-arm for the next one."""
        self._timer = None
        if self.sink is None:
            return
        clock = self._clock()
        now = clock + _EARLY
        due = self._deadline
        if now >= due:
            return self._timed_out(TOTAL, f"no complete response within {self._timeout:g}s")
        last = self._last
        if not last:
            if self._first_byte:
                first = self._sent + self._first_byte
                if now >= first:
                    return self._timed_out(FIRST_BYTE, f"no response within {self._first_byte:g}s (first-byte timeout)")
                due = min(due, first)
            if self._idle:
                due = min(due, now + self._idle)  # the body may start and stop before the first-byte deadline
        elif self._idle:
            silent_until = last + self._idle
            if now >= silent_until:
                return self._timed_out(
                    INTER_CHUNK, f"upstream silent for {self._idle:g}s mid-response (inter-chunk timeout)"
                )
            due = min(due, silent_until)
        self._timer = self.pool.loop.call_later(due - clock, self._on_timer)

    def _timed_out(self, reason: str, message: str) -> None:
        self._fail(UpstreamError(TIMEOUT, message, self._started, reason))
        self.close()

    # -- asyncio.Protocol -----------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # noqa: D102
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102
        self.closed = True
        self.pool.forget(self)
        sink = self.sink
        if sink is None:
            return
        if self.reused and not self._started:
            # a kept-alive socket the upstream had already closed: resend once on a fresh one, transparently
            self.sink = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self.pool.loop.create_task(
                self.pool.resend(self._request, sink, self._timeout, self._first_byte, self._idle)
            )
            return
        kind = RESET if self._started else CONNECT_FAILED
        self._fail(UpstreamError(kind, f"upstream closed the connection ({exc or 'EOF'})", self._started))

    def data_received(self, data: bytes) -> None:  # noqa: D102
        self._started = True
        timed = self._first_byte or self._idle
        if timed:
            self._now = self._clock()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(PROTOCOL, f"bad HTTP from upstream: {exc}", True))
            self.close()
            return
        if timed and self._last == self._now:
            self.pool.last_data = self._now  # a sign of life: body bytes of a leg (health replies do not count)
        sink = self.sink
        if sink is not None:
            sink.on_batch_end()

    def eof_received(self) -> bool:  # noqa: D102
        return False

    # -- httptools callbacks --------------------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:  # noqa: D102
        lname = name.lower()
        if lname == b"content-type":
            self._ctype = value
        elif lname == b"content-length":
            self._clen = int(value)

    def on_headers_complete(self) -> None:  # noqa: D102
        if self.sink is not None:
            self.sink.on_head(self.parser.get_status_code(), self._ctype, self._clen)

    def on_body(self, body: bytes) -> None:  # noqa: D102
        self._last = self._now
        if self.sink is not None:
            self.sink.on_body(body)

    def on_message_complete(self) -> None:  # noqa: D102
        sink = self.sink
        self.sink = None
        self._request = b""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.parser.should_keep_alive():
            self.resume_reading()  # a slow client may have paused us; the next exchange must read
            self.pool.release(self)
        else:
            self.close()
        if sink is not None:
            sink.on_complete()


class UpstreamPool:
    """Keep-alive connections to one upstream host:port."""

    def __init__(self, host: str, port: int, connect_timeout: float = 2.0, max_idle: int = 256) -> None:
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        self.loop = asyncio.get_running_loop()
        self.idle: list[UpstreamConnection] = []
        self.closed = False
        self.last_data = 0.0  # loop time a leg last got body bytes from this upstream (its sign of life)

    async def connect(self) -> UpstreamConnection:
        """A fresh connection; UpstreamError(CONNECT_FAILED) on refusal or after connect_timeout."""
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(lambda: UpstreamConnection(self), self.host, self.port),
                self.connect_timeout,
            )
        except (OSError, asyncio.TimeoutError) as exc:
            reason = "connect timeout" if isinstance(exc, asyncio.TimeoutError) else str(exc) or type(exc).__name__
            raise UpstreamError(CONNECT_FAILED, f"cannot connect to {self.host}:{self.port}: {reason}") from None
        return conn

    async def acquire(self) -> UpstreamConnection:
        """An idle kept-alive connection if there is one, else a new one."""
        idle = self.idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                conn.reused = True
                return conn
        return await self.connect()

    def send_now(
        self, request: bytes, sink: ResponseSink, timeout: float, first_byte: float = 0.0, idle: float = 0.0
    ) -> UpstreamConnection | None:
        """Start one exchange on an idle kept-alive connection without a suspension point; None if none is idle.
        Timeouts as in UpstreamConnection.send."""
        idle_conns = self.idle
        while idle_conns:
            conn = idle_conns.pop()
            if not conn.closed:
                conn.reused = True
                conn.send(request, sink, timeout, first_byte, idle)
                return conn
        return None

    async def send(
        self, request: bytes, sink: ResponseSink, timeout: float, first_byte: float = 0.0, idle: float = 0.0
    ) -> UpstreamConnection | None:
        """Start one exchange; on connect failure the sink hears it and None is returned."""
        try:
            conn = await self.acquire()
        except UpstreamError as exc:
            sink.on_failure(exc)
            return None
        conn.send(request, sink, timeout, first_byte, idle)
        return conn

    async def resend(
        self, request: bytes, sink: ResponseSink, timeout: float, first_byte: float = 0.0, idle: float = 0.0
    ) -> None:
        """Retry an exchange whose kept-alive socket turned out dead, on a new connection."""
        try:
            conn = await self.connect()
        except UpstreamError as exc:
            sink.on_failure(exc)
            return
        rebind = getattr(sink, "rebind", None)
        if rebind is not None:
            rebind(conn)
        conn.send(request, sink, timeout, first_byte, idle)

    def release(self, conn: UpstreamConnection) -> None:
        """Return a connection whose exchange completed cleanly."""
        if self.closed or len(self.idle) >= self.max_idle or conn.closed:
            conn.close()
        else:
            self.idle.append(conn)

    def forget(self, conn: UpstreamConnection) -> None:
        """Drop a closed connection from the idle list."""
        try:
            self.idle.remove(conn)
        except ValueError:
            pass

    def close(self) -> None:
        """Close idle connections; busy ones close when their exchange ends."""
        self.closed = True
        idle, self.idle = self.idle, []
        for conn in idle:
            conn.close()


class CollectSink:
    """Collects a whole (small) response: status, content type and body; resolves `done` when it ends."""

    __slots__ = ("done", "status", "content_type", "parts", "error", "conn")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.done: asyncio.Future[None] = loop.create_future()
        self.status = 0
        self.content_type = b""
        self.parts: list[bytes] = []
        self.error: UpstreamError | None = None
        self.conn: UpstreamConnection | None = None

    @property
    def body(self) -> bytes:
        """The body received so far."""
        return b"".join(self.parts)

    @property
    def timed_out(self) -> str:
        """Which deadline the exchange missed (FIRST_BYTE, INTER_CHUNK, TOTAL), or "" if it did not time out."""
        error = self.error
        return error.reason if error is not None and error.kind == TIMEOUT else ""

    def rebind(self, conn: UpstreamConnection) -> None:
        """The exchange moved to another connection (transparent resend)."""
        self.conn = conn

    def on_head(self, status: int, content_type: bytes, content_length: int) -> None:  # noqa: D102
        self.status = status
        self.content_type = content_type

    def on_body(self, data: bytes) -> None:  # noqa: D102
        self.parts.append(data)

    def on_batch_end(self) -> None:  # noqa: D102
        pass

    def on_complete(self) -> None:  # noqa: D102
        if not self.done.done():
            self.done.set_result(None)

    def on_failure(self, error: UpstreamError) -> None:  # noqa: D102
        self.error = error
        if not self.done.done():
            self.done.set_result(None)


def request_bytes(
    method: bytes, path: bytes, host_header: bytes, body: bytes = b"", extra_headers: bytes = b""
) -> bytes:
    """A complete HTTP/1.1 request; `extra_headers` is pre-formatted `Name: value\\r\\n` lines."""
    head = b"%s %s HTTP/1.1\r\nHost: %s\r\n%s" % (method, path, host_header, extra_headers)
    if body or method == b"POST":
        return head + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    return head + b"\r\n"


async def fetch(pool: UpstreamPool, request: bytes, timeout: float) -> CollectSink:
    """Send one request and collect the whole response (errors land in `.error`)."""
    sink = CollectSink(pool.loop)
    sink.conn = await pool.send(request, sink, timeout)
    await sink.done
    return sink
