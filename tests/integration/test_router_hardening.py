"""The router's hardening against hostile or broken clients and hung engines, on real processes on 127.0.0.1.

- Engine-internal fields (kv_transfer_params, ...) from a client never reach an engine, on any path.
- HTTP limits: body size (413, refused before it is read), request line (414), header block (431), header and idle
  timeouts (slowloris), non-JSON POST bodies (415), parse errors (400 with a JSON error body).
- First-byte and inter-chunk timeouts of the upstream legs: a hung engine that still answers /health is routed around
  and kept out until it serves again.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from pdfleet.testing.engine_process import EngineProcess, start_engine
from pdfleet.testing.router_process import RouterProcess

MODEL = "test-model"
LONG_PROMPT = "word " * 300  # disaggregated by the router's estimate
SHORT_PROMPT = "hi there"  # direct
FAST_HEALTH = ("--health-interval", "0.3", "--health-timeout", "1", "--fleet-poll-seconds", "0.2")


# ------------------------------------------------------------------------------------------------------ helpers
def engine(role: str, rack: str = "rack-a", *extra: str) -> EngineProcess:
    return start_engine(role, rack=rack, served_model_name=MODEL, extra_args=extra)


def endpoint(name: str, pool: str, url: str, rack: str = "rack-a") -> dict:
    return {"name": name, "pool": pool, "url": url, "rack": rack, "zone": "zone-1", "draining": False}


def view(endpoints: list[dict], **policy: Any) -> dict:
    return {
        "version": 1,
        "generation": 1,
        "model": MODEL,
        "endpoints": endpoints,
        "policy": {"maxPrefillRetries": 1, "maxDecodeRetries": 1, "prefillTimeoutSeconds": 30, **policy},
    }


class Router(RouterProcess):
    """RouterProcess with fast health checks, readers of /metrics and /admin/endpoints, and a stop that fails the
    test on any unhandled error inside the router."""

    def __init__(self, fleet: dict, *extra: str) -> None:
        super().__init__(fleet, [*FAST_HEALTH, "--shutdown-grace", "2", *extra], ready_timeout=15)
        self.host, self.addr = "127.0.0.1", ("127.0.0.1", self.port)

    def metrics(self) -> dict[str, float]:
        out = {}
        for line in httpx.get(self.admin + "/metrics", trust_env=False).text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def endpoints(self) -> dict[str, dict]:
        rows = httpx.get(self.admin + "/admin/endpoints", headers=self.admin_headers, trust_env=False).json()[
            "endpoints"
        ]
        return {e["name"]: e for e in rows}

    def rss_kib(self) -> int:
        with open(f"/proc/{self.proc.pid}/status", encoding="ascii") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:"))

    def stop(self) -> str:
        log = super().stop()
        assert "Traceback" not in log and "exception was never retrieved" not in log, log[-3000:]
        return log


def body(prompt: str, stream: bool = False, max_tokens: int = 8, **extra: Any) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream, **extra}


def engine_count(proc: EngineProcess, metric: str) -> float:
    text = httpx.get(proc.url + "/metrics", trust_env=False).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(metric))


def set_faults(proc: EngineProcess, **faults: Any) -> None:
    httpx.post(proc.url + "/internal/faults", json=faults, trust_env=False).raise_for_status()


def sse_events(text: str) -> list[str]:
    return [chunk[len("data: ") :] for chunk in text.split("\n\n") if chunk.startswith("data: ")]


async def call(client: httpx.AsyncClient, url: str, payload: dict) -> tuple[int, str]:
    try:
        async with client.stream("POST", url + "/v1/completions", json=payload) as resp:
            return resp.status_code, (await resp.aread()).decode()
    except httpx.HTTPError as exc:
        return -1, repr(exc)


async def batch(url: str, payloads: list[dict], bound: float) -> list[tuple[int, str]]:
    """Concurrent requests that must all end within `bound` seconds."""
    async with httpx.AsyncClient(timeout=bound + 30, trust_env=False) as client:
        return await asyncio.wait_for(asyncio.gather(*(call(client, url, p) for p in payloads)), bound)


def raw_exchange(addr: tuple[str, int], data: bytes, wait: float = 3.0) -> bytes:
    """Send raw bytes, then read until the router closes the connection (or `wait` seconds pass)."""
    with socket.create_connection(addr, timeout=wait) as sock:
        try:
            sock.sendall(data)
        except OSError:
            pass
        return read_until_closed(sock, wait)


def read_until_closed(sock: socket.socket, wait: float) -> bytes:
    """Everything the peer sends until it closes; raises AssertionError if it is still open after `wait` seconds."""
    out, deadline = b"", time.monotonic() + wait
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except socket.timeout:
            raise AssertionError(f"connection still open after {wait}s; got {out[:300]!r}") from None
        except ConnectionResetError:
            return out
        if not data:
            return out
        out += data


def status_and_json(reply: bytes) -> tuple[int, dict]:
    head, _, rest = reply.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(rest) if rest else {}


class TrapListener:
    """A TCP listener on 127.0.0.1 that records every connection made to it (where a forged remote_host points)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


class RecordingDecode:
    """A fake decode engine (HTTP on 127.0.0.1) that records each JSON body it is sent and answers a completion."""

    def __init__(self) -> None:
        bodies: list[dict] = []
        self.bodies = bodies

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._reply(b"")

            def do_POST(self) -> None:
                bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self._reply(b'{"id":"cmpl-1","object":"text_completion","choices":[{"text":"ok","index":0}]}')

            def _reply(self, payload: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ------------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def pair() -> Iterator[dict[str, EngineProcess]]:
    """One prefill and one decode in rack-a, normal timing of a small model."""
    procs: dict[str, EngineProcess] = {}
    try:
        procs["p"] = engine("prefill")
        procs["d"] = engine("decode")
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()


def pair_view(pair: dict[str, EngineProcess]) -> dict:
    return view([endpoint("p", "prefill", pair["p"].url), endpoint("d", "decode", pair["d"].url)])


@pytest.fixture
def router(pair: dict[str, EngineProcess]) -> Iterator[Router]:
    """A router with the default limits."""
    r = Router(pair_view(pair))
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
def impatient_router(pair: dict[str, EngineProcess]) -> Iterator[Router]:
    """A router with short read timeouts (sweeps every 0.25 s)."""
    r = Router(pair_view(pair), "--header-timeout", "1", "--body-timeout", "2", "--idle-timeout", "2")
    try:
        yield r
    finally:
        r.stop()


# ------------------------------------------------------------------------------- 1. engine-internal fields
def forged_params(port: int) -> dict:
    """kv_transfer_params telling a decode to pull KV from a host of the client's choosing."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [1, 2, 3],
        "remote_engine_id": "forged",
        "remote_request_id": "forged",
        "remote_host": "127.0.0.1",
        "remote_port": port,
    }


async def test_client_kv_transfer_params_never_reach_an_engine(router: Router, pair: dict[str, EngineProcess]) -> None:
    trap = TrapListener()
    try:
        pulled = engine_count(pair["d"], "pdfleet_engine_kv_transfer_bytes_total")
        failures = engine_count(pair["d"], "pdfleet_engine_kv_transfer_failures_total")
        forged = {"kv_transfer_params": forged_params(trap.port)}
        results = await batch(
            router.url,
            [
                body(SHORT_PROMPT, **forged),  # direct path
                body(SHORT_PROMPT, stream=True, **forged),
                body(LONG_PROMPT, **forged),  # disaggregated path: the router's own params replace the client's
                body(LONG_PROMPT, stream=True, **forged),
            ],
            bound=20,
        )
        assert [s for s, _ in results] == [200] * 4, results
        time.sleep(0.3)
        assert trap.connections == 0  # no engine was made to call the client's host
        assert engine_count(pair["d"], "pdfleet_engine_kv_transfer_failures_total") == failures
        # the decode pulled KV for the two disaggregated requests only, from the real prefill
        assert engine_count(pair["d"], "pdfleet_engine_kv_transfer_bytes_total") > pulled
    finally:
        trap.close()


async def test_the_decode_receives_no_client_internal_fields() -> None:
    decode = RecordingDecode()
    r = Router(view([endpoint("d", "decode", decode.url)]))
    try:
        sent = body(
            SHORT_PROMPT,
            kv_transfer_params=forged_params(1),
            ec_transfer_params={"remote_host": "127.0.0.1"},
            vllm_xargs={"kv_transfer_params": "x", "keep": 1},
        )
        results = await batch(r.url, [sent, body(SHORT_PROMPT)], bound=10)
        assert [s for s, _ in results] == [200, 200], results
        forwarded = sorted(decode.bodies, key=len)
        assert forwarded[0] == body(SHORT_PROMPT)  # a clean request is forwarded as it is
        assert forwarded[1] == body(SHORT_PROMPT, vllm_xargs={"keep": 1})
    finally:
        r.stop()
        decode.close()


# ------------------------------------------------------------------------------- 2. parse errors
async def test_parse_errors_get_a_400_with_a_json_error_body(router: Router) -> None:
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n"
    )
    for payload in (
        b"[" * 200_000,  # RecursionError inside json
        b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        json.dumps({"model": MODEL, "prompt": [[[1], [2]] * 300]}).encode(),  # unhashable prompt blocks
        b"{not json",
    ):
        status, error = status_and_json(raw_exchange(router.addr, (head % len(payload)) + payload))
        assert status == 400 and error["error"]["code"] == 400 and error["error"]["message"], (payload[:40], error)
    status, error = status_and_json(raw_exchange(router.addr, b"GARBAGE / HTTP/1.1\r\n\r\n"))
    assert status == 400 and error["error"]["message"]
    # the admin port too (PUT /admin/fleet parses its body, once the token is right)
    deep = b"[" * 200_000
    head = b"PUT /admin/fleet HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n"
    put = head % (router.admin_token.encode(), len(deep)) + deep
    status, error = status_and_json(raw_exchange(("127.0.0.1", router.admin_port), put))
    assert status == 400 and error["error"]["message"]
    assert httpx.get(router.url + "/health", trust_env=False).status_code == 200  # still serving


# ------------------------------------------------------------------------------- 3. limits
async def test_an_oversized_body_is_refused_before_it_is_read(router: Router) -> None:
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % (256 << 20)
    )
    started = time.monotonic()
    reply = raw_exchange(router.addr, head + b"{" * 1000)  # the rest of the 256 MiB never comes
    status, error = status_and_json(reply)
    assert status == 413 and "8388608" in error["error"]["message"]
    assert time.monotonic() - started < 2
    assert b"connection: close" in reply.lower()


async def test_a_chunked_body_is_counted_as_it_arrives(router: Router) -> None:
    rss = router.rss_kib()
    chunk = b"a" * (1 << 20)
    frame = b"%x\r\n%s\r\n" % (len(chunk), chunk)
    with socket.create_connection(router.addr, timeout=5) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        sent = 0
        try:
            while sent < 64 and not select.select([sock], [], [], 0)[0]:  # up to 64 MiB, until the router answers
                sock.sendall(frame)
                sent += 1
        except OSError:
            pass
        reply = read_until_closed(sock, 5)
    assert status_and_json(reply)[0] == 413
    assert sent < 32  # the router answered once the body passed 8 MiB
    assert router.rss_kib() - rss < 48 * 1024  # not buffered


async def test_request_line_and_header_limits(router: Router) -> None:
    status, error = status_and_json(raw_exchange(router.addr, b"GET /" + b"a" * (64 << 10) + b" HTTP/1.1\r\n\r\n"))
    assert status == 414 and error["error"]["message"]
    big = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * (64 << 10) + b"\r\n\r\n"
    assert status_and_json(raw_exchange(router.addr, big))[0] == 431
    many = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(200))
    assert status_and_json(raw_exchange(router.addr, many + b"\r\n"))[0] == 431
    # the admin port has the same limits
    admin = ("127.0.0.1", router.admin_port)
    assert status_and_json(raw_exchange(admin, big))[0] == 431
    # within the limits all is as before
    ok = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Fine: " + b"f" * 8000 + b"\r\nConnection: close\r\n\r\n"
    assert status_and_json(raw_exchange(router.addr, ok))[0] == 200


async def test_slowloris_headers_are_cut_off(impatient_router: Router) -> None:
    router = impatient_router
    with socket.create_connection(router.addr, timeout=5) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        try:
            for i in range(40):  # a header line every 0.1 s, until the router answers: would take 4 s
                if select.select([sock], [], [], 0)[0]:
                    break
                sock.sendall(b"X-Slow-%d: 1\r\n" % i)
                time.sleep(0.1)
        except OSError:
            pass
        cut_after = time.monotonic() - started
        reply = read_until_closed(sock, 3)
    assert cut_after < 1.8  # 1 s header timeout, sweeps every 0.25 s
    if reply:  # a 408 made it out before the reset
        assert status_and_json(reply)[0] == 408


async def test_idle_and_silent_connections_are_closed(impatient_router: Router) -> None:
    router = impatient_router
    with socket.create_connection(router.addr, timeout=5) as sock:  # connects, says nothing
        started = time.monotonic()
        assert read_until_closed(sock, 3) == b""
        assert time.monotonic() - started < 2
    with socket.create_connection(router.addr, timeout=5) as sock:  # one request, then idle on keep-alive
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        started = time.monotonic()
        reply = read_until_closed(sock, 4)
        assert reply.startswith(b"HTTP/1.1 200") and 1.5 < time.monotonic() - started < 3.5
    # a slow but steady stream is not cut by the idle timeout
    async with httpx.AsyncClient(timeout=20, trust_env=False) as client:
        status, text = await call(client, router.url, body(LONG_PROMPT, stream=True, max_tokens=400))
    assert status == 200 and sse_events(text)[-1] == "[DONE]"


async def test_non_json_content_type_gets_415(router: Router) -> None:
    payload = json.dumps(body(SHORT_PROMPT)).encode()
    for ctype in (b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data; boundary=x"):
        request = (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (ctype, len(payload), payload)
        )
        status, error = status_and_json(raw_exchange(router.addr, request))
        assert status == 415 and "application/json" in error["error"]["message"], ctype
    for ctype in (b"application/json", b"Application/JSON; charset=utf-8", b"application/vnd.api+json"):
        request = (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (ctype, len(payload), payload)
        )
        assert status_and_json(raw_exchange(router.addr, request, wait=10))[0] == 200, ctype
    untyped = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
    assert status_and_json(raw_exchange(router.addr, untyped % (len(payload), payload), wait=10))[0] == 200


# ------------------------------------------------------------------------------- 4. leg timeouts
async def test_hung_decode_is_routed_around_and_kept_out_until_it_serves(pair: dict[str, EngineProcess]) -> None:
    hung = engine("decode", "rack-a", "--fault-hang")  # accepts requests, never answers them; /health says 200
    r = Router(
        view(
            [
                endpoint("p", "prefill", pair["p"].url),
                endpoint("d-hung", "decode", hung.url),
                endpoint("d", "decode", pair["d"].url),
            ],
            decodeTimeoutSeconds=60,
            firstByteTimeoutSeconds=1,
            interChunkTimeoutSeconds=1,
        ),
        "--timeout-hold-seconds",
        "5",
    )
    try:
        started = time.monotonic()
        payloads = [body(SHORT_PROMPT), body(SHORT_PROMPT, stream=True), body(LONG_PROMPT)]
        results = await batch(r.url, payloads * 2, bound=8)
        assert [s for s, _ in results] == [200] * 6, results
        assert time.monotonic() - started < 6  # not decodeTimeoutSeconds
        m = r.metrics()
        assert m['pdfleet_router_upstream_timeouts_total{kind="first_byte",pool="decode"}'] >= 1
        assert m['pdfleet_router_retries_total{leg="decode"}'] >= 1
        # its /health answers 200, yet it stays out: no new work goes there
        time.sleep(1.0)  # > 3 health rounds
        assert r.endpoints()["d-hung"]["healthy"] is False
        retries = r.metrics()['pdfleet_router_retries_total{leg="decode"}']
        started = time.monotonic()
        results = await batch(r.url, payloads * 2, bound=8)
        assert [s for s, _ in results] == [200] * 6
        assert time.monotonic() - started < 3
        assert r.metrics()['pdfleet_router_retries_total{leg="decode"}'] == retries
        assert r.endpoints()["d-hung"]["inflight"] == 0
        # once it serves again, the health loop brings it back after the hold
        set_faults(hung, hang=False)
        deadline = time.monotonic() + 10
        while not r.endpoints()["d-hung"]["healthy"]:
            assert time.monotonic() < deadline, "the recovered decode never came back"
            time.sleep(0.1)
    finally:
        r.stop()
        hung.stop()


async def test_hung_prefill_is_cut_at_first_byte(pair: dict[str, EngineProcess]) -> None:
    hung = engine("prefill", "rack-a", "--fault-hang")
    r = Router(
        view(
            [
                endpoint("p-hung", "prefill", hung.url),
                endpoint("p", "prefill", pair["p"].url),
                endpoint("d", "decode", pair["d"].url),
            ],
            prefillTimeoutSeconds=60,
            prefixAffinity=False,
            firstByteTimeoutSeconds=1,
        )
    )
    try:
        started = time.monotonic()
        results = await batch(r.url, [body(LONG_PROMPT + str(i)) for i in range(4)], bound=8)
        assert [s for s, _ in results] == [200] * 4, results
        assert time.monotonic() - started < 6
        m = r.metrics()
        assert m['pdfleet_router_upstream_timeouts_total{kind="first_byte",pool="prefill"}'] >= 1
        assert r.endpoints()["p-hung"]["healthy"] is False
    finally:
        r.stop()
        hung.stop()


async def test_decode_stalling_mid_stream_ends_with_a_clear_error(pair: dict[str, EngineProcess]) -> None:
    stalling = engine("decode", "rack-a")
    r = Router(view([endpoint("d-stall", "decode", stalling.url)], decodeTimeoutSeconds=60, interChunkTimeoutSeconds=1))
    try:
        async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
            started = time.monotonic()
            async with client.stream(
                "POST", r.url + "/v1/completions", json=body(SHORT_PROMPT, stream=True, max_tokens=2000)
            ) as resp:
                assert resp.status_code == 200
                text = ""
                async for piece in resp.aiter_text():
                    if not text:
                        set_faults(stalling, slowdown=100000.0)  # the next decode step takes "forever"
                        stalled_at = time.monotonic()
                    text += piece
        assert time.monotonic() - stalled_at < 3.5 and time.monotonic() - started < 10
        events = sse_events(text)
        assert events[-1] != "[DONE]"
        message = json.loads(events[-1])["error"]["message"]
        assert "mid-stream" in message and "inter-chunk" in message, message
        m = r.metrics()
        assert m['pdfleet_router_upstream_timeouts_total{kind="inter_chunk",pool="decode"}'] == 1
        assert r.endpoints()["d-stall"]["healthy"] is False
    finally:
        r.stop()
        stalling.stop()
