"""The PD router against real emulator processes on 127.0.0.1: handshake, direct path, failover, fleet changes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from pdfleet.testing.engine_process import EngineProcess, start_engine
from pdfleet.testing.router_process import RouterProcess

MODEL = "test-model"
LONG_PROMPT = "word " * 300  # ~375 tokens by the router's estimate: disaggregated
SHORT_PROMPT = "hi there"  # direct
REQUEST_BOUND_S = 20.0  # every request must end (success or clear error) within this


# ------------------------------------------------------------------------------------------------------ helpers
def engine(role: str, rack: str, *extra: str) -> EngineProcess:
    return start_engine(role, rack=rack, served_model_name=MODEL, extra_args=extra)


def endpoint(name: str, pool: str, proc: EngineProcess, zone: str = "zone-1", draining: bool = False) -> dict:
    return {"name": name, "pool": pool, "url": proc.url, "rack": proc.rack, "zone": zone, "draining": draining}


def view(endpoints: list[dict], generation: int = 1, **policy: Any) -> dict:
    return {
        "version": 1,
        "generation": generation,
        "model": MODEL,
        "endpoints": endpoints,
        "policy": {
            "maxPrefillRetries": 2,
            "maxDecodeRetries": 1,
            "prefillTimeoutSeconds": 10,
            "decodeTimeoutSeconds": 30,
            **policy,
        },
    }


class Router(RouterProcess):
    """The shared router launcher with fast health checks, /metrics and /admin/endpoints readers, and a stop that
    fails the test on any unhandled error inside the router."""

    def __init__(self, fleet: dict) -> None:
        super().__init__(
            fleet,
            [
                "--health-interval",
                "0.3",
                "--health-timeout",
                "1",
                "--fleet-poll-seconds",
                "0.2",
                "--shutdown-grace",
                "2",
            ],
            ready_timeout=15,
        )

    def metrics(self) -> dict[str, float]:
        """`name{labels}` -> value of every sample on /metrics."""
        out = {}
        for line in httpx.get(self.admin + "/metrics").text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def endpoints(self) -> dict[str, dict]:
        return {
            e["name"]: e
            for e in httpx.get(self.admin + "/admin/endpoints", headers=self.admin_headers).json()["endpoints"]
        }

    def stop(self) -> str:
        log = super().stop()
        assert "Traceback" not in log, log[-3000:]  # no unhandled error inside the router
        return log


def engine_count(proc: EngineProcess, metric: str) -> float:
    """Sum of an engine metric's samples (e.g. finished requests, KV bytes pulled)."""
    text = httpx.get(proc.url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(metric))


def set_faults(proc: EngineProcess, **faults: Any) -> None:
    httpx.post(proc.url + "/internal/faults", json=faults).raise_for_status()


def body(prompt: str, stream: bool = False, max_tokens: int = 8) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}


async def call(client: httpx.AsyncClient, url: str, payload: dict) -> tuple[int, str]:
    """One request, read to the end; (status, text) or (-1, reason) if the transport broke."""
    try:
        async with client.stream("POST", url + "/v1/completions", json=payload) as resp:
            text = (await resp.aread()).decode()
            return resp.status_code, text
    except httpx.HTTPError as exc:
        return -1, repr(exc)


async def batch(url: str, payloads: list[dict], during: Any = None) -> list[tuple[int, str]]:
    """Concurrent requests; `during` (a coroutine) runs alongside. Each request is bounded: none may hang."""
    async with httpx.AsyncClient(timeout=REQUEST_BOUND_S) as client:
        tasks = [asyncio.create_task(call(client, url, p)) for p in payloads]
        if during is not None:
            await during
        return await asyncio.wait_for(asyncio.gather(*tasks), REQUEST_BOUND_S + 5)


def assert_clear(results: list[tuple[int, str]]) -> None:
    """Zero lost requests: each one succeeded or ended with a JSON error naming what failed."""
    for status, text in results:
        if status != 200:
            assert status in (502, 503, 504), (status, text)
            assert json.loads(text)["error"]["message"], text


def sse_events(text: str) -> list[str]:
    return [chunk[len("data: ") :] for chunk in text.split("\n\n") if chunk.startswith("data: ")]


# ------------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def fleet() -> Iterator[dict[str, EngineProcess]]:
    """Prefill and decode in rack-a and rack-b (one zone), normal timing of a small model."""
    procs: dict[str, EngineProcess] = {}
    try:
        for name, role, rack in (
            ("p-a", "prefill", "rack-a"),
            ("p-b", "prefill", "rack-b"),
            ("d-a", "decode", "rack-a"),
            ("d-b", "decode", "rack-b"),
        ):
            procs[name] = engine(role, rack)
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()


def full_view(
    fleet: dict[str, EngineProcess], generation: int = 1, draining: tuple[str, ...] = (), **policy: Any
) -> dict:
    return view(
        [
            endpoint(n, "prefill" if n.startswith("p") else "decode", p, draining=n in draining)
            for n, p in fleet.items()
        ],
        generation,
        **policy,
    )


@pytest.fixture
def router(fleet: dict[str, EngineProcess]) -> Iterator[Router]:
    r = Router(full_view(fleet))
    try:
        yield r
    finally:
        r.stop()


# ------------------------------------------------------------------------------------------------------ tests
async def test_disaggregated_end_to_end(router: Router, fleet: dict[str, EngineProcess]) -> None:
    pulled = sum(engine_count(fleet[d], "pdfleet_engine_kv_transfer_bytes_total") for d in ("d-a", "d-b"))
    results = await batch(
        router.url,
        [body(LONG_PROMPT + str(i)) for i in range(6)]
        + [body(LONG_PROMPT, stream=True, max_tokens=20) for _ in range(4)],
    )
    assert [s for s, _ in results] == [200] * 10, results
    assert json.loads(results[0][1])["usage"]["completion_tokens"] == 8
    for _, text in results[6:]:
        events = sse_events(text)
        assert events[-1] == "[DONE]" and len(events) == 21
        assert all("error" not in json.loads(e) for e in events[:-1])
    m = router.metrics()
    assert m['pdfleet_router_requests_total{path="disaggregated",status="200"}'] == 10
    assert m['pdfleet_router_pairs_total{locality="same_rack"}'] == 10  # preferred locality: rack-local decode
    assert m["pdfleet_router_ttft_seconds_count"] == 4 and m["pdfleet_router_tpot_seconds_count"] == 4
    # every decode pulled its KV from a prefill: the two-stage handshake really happened
    assert sum(engine_count(fleet[d], "pdfleet_engine_kv_transfer_bytes_total") for d in ("d-a", "d-b")) > pulled


async def test_short_prompts_take_the_direct_path(router: Router, fleet: dict[str, EngineProcess]) -> None:
    before = {n: engine_count(p, "vllm:e2e_request_latency_seconds_count") for n, p in fleet.items()}
    results = await batch(router.url, [body(SHORT_PROMPT)] * 4 + [body(SHORT_PROMPT, stream=True)] * 2)
    assert [s for s, _ in results] == [200] * 6
    after = {n: engine_count(p, "vllm:e2e_request_latency_seconds_count") for n, p in fleet.items()}
    assert after["p-a"] == before["p-a"] and after["p-b"] == before["p-b"]  # no prefill involved
    assert after["d-a"] + after["d-b"] - before["d-a"] - before["d-b"] == 6
    assert router.metrics()['pdfleet_router_requests_total{path="direct",status="200"}'] == 6


async def test_with_the_prefill_pool_at_zero_every_prompt_is_served_whole_on_a_decode(
    fleet: dict[str, EngineProcess],
) -> None:
    before = {n: engine_count(p, "vllm:e2e_request_latency_seconds_count") for n, p in fleet.items()}
    decodes_only = view([endpoint(n, "decode", fleet[n]) for n in ("d-a", "d-b")])
    draining = full_view(fleet, draining=("p-a", "p-b"))  # the autoscaler's drain of the last prefills
    for fleet_view in (decodes_only, draining):
        r = Router(fleet_view)
        try:
            results = await batch(r.url, [body(LONG_PROMPT + str(i)) for i in range(3)])
            assert [s for s, _ in results] == [200] * 3, results
            m = r.metrics()
            assert m['pdfleet_router_requests_total{path="direct",status="200"}'] == 3
            assert m.get("pdfleet_router_fallbacks_total", 0) == 0  # the fleet's shape, not a failure
        finally:
            r.stop()
    after = {n: engine_count(p, "vllm:e2e_request_latency_seconds_count") for n, p in fleet.items()}
    assert after["p-a"] == before["p-a"] and after["p-b"] == before["p-b"]


async def test_kv_transfer_failures_retry_then_fall_back(router: Router, fleet: dict[str, EngineProcess]) -> None:
    try:
        for p in ("p-a", "p-b"):
            set_faults(fleet[p], fail_kv_source=1)  # the first pull from a prefill fails, its KV stays held
        first = await batch(router.url, [body(LONG_PROMPT)])
        assert first[0][0] == 200, first  # the decode failed the pull, the retry on the other decode succeeded
        m = router.metrics()
        assert m['pdfleet_router_retries_total{leg="decode"}'] == 1
        assert m['pdfleet_router_kv_handshake_failures_total{reason="decode_upstream_5xx"}'] == 1
        assert m['pdfleet_router_requests_total{path="disaggregated",status="200"}'] == 1
        set_faults(fleet["d-a"], fail_kv_pull=100)
        set_faults(fleet["d-b"], fail_kv_pull=100)
        results = await batch(router.url, [body(LONG_PROMPT), body(LONG_PROMPT, stream=True)])
        assert [s for s, _ in results] == [200, 200], results  # full prefill on a decode: no KV pull needed
        m = router.metrics()
        assert m["pdfleet_router_fallbacks_total"] == 2
        assert m['pdfleet_router_requests_total{path="fallback",status="200"}'] == 2
    finally:
        for name in ("d-a", "d-b", "p-a", "p-b"):
            set_faults(fleet[name], fail_kv_pull=0, fail_kv_source=0)


async def test_killed_prefill_is_routed_around(fleet: dict[str, EngineProcess]) -> None:
    doomed = engine("prefill", "rack-a", "--fault-slowdown", "50")  # slow: requests are inside it when it dies
    r = Router(
        view(
            [
                endpoint("p-doomed", "prefill", doomed),
                endpoint("p-a", "prefill", fleet["p-a"]),
                endpoint("d-a", "decode", fleet["d-a"]),
                endpoint("d-b", "decode", fleet["d-b"]),
            ],
            prefixAffinity=False,
        )
    )
    try:

        async def kill_soon() -> None:
            await asyncio.sleep(0.3)
            doomed.kill()

        payloads = [body(LONG_PROMPT + str(i), stream=i % 2 == 0, max_tokens=30) for i in range(24)]
        results = await batch(r.url, payloads, during=kill_soon())
        assert [s for s, _ in results] == [200] * 24, results  # concurrent requests succeed via the other prefill
        later = await batch(r.url, [body(LONG_PROMPT + str(i)) for i in range(6)])
        assert [s for s, _ in later] == [200] * 6
        assert r.endpoints()["p-doomed"]["healthy"] is False
        assert r.metrics()['pdfleet_router_retries_total{leg="prefill"}'] >= 1  # the kill did hit requests
    finally:
        r.stop()
        doomed.stop()


async def test_hung_prefill_times_out_and_another_serves(fleet: dict[str, EngineProcess]) -> None:
    r = Router(
        view(
            [
                endpoint("p-a", "prefill", fleet["p-a"]),
                endpoint("p-b", "prefill", fleet["p-b"]),
                endpoint("d-a", "decode", fleet["d-a"]),
            ],
            prefillTimeoutSeconds=1,
            prefixAffinity=False,
        )
    )
    set_faults(fleet["p-b"], hang=True)
    try:
        started = time.monotonic()
        results = await batch(r.url, [body(LONG_PROMPT + str(i)) for i in range(4)])
        assert [s for s, _ in results] == [200] * 4
        assert time.monotonic() - started < 5
        assert r.metrics()['pdfleet_router_retries_total{leg="prefill"}'] >= 1
    finally:
        set_faults(fleet["p-b"], hang=False)
        r.stop()


async def test_decode_dying_mid_stream_ends_with_a_clear_error(fleet: dict[str, EngineProcess]) -> None:
    doomed = engine("decode", "rack-a", "--fault-crash-after-tokens", "40")
    r = Router(view([endpoint("p-a", "prefill", fleet["p-a"]), endpoint("d-doomed", "decode", doomed)]))
    try:
        started = time.monotonic()
        ((status, text),) = await batch(r.url, [body(LONG_PROMPT, stream=True, max_tokens=200)])
        assert status == 200 and time.monotonic() - started < REQUEST_BOUND_S
        events = sse_events(text)
        assert len(events) >= 2 and events[-1] != "[DONE]"
        error = json.loads(events[-1])["error"]
        assert "decode leg failed mid-stream" in error["message"]
        assert r.metrics()['pdfleet_router_requests_total{path="disaggregated",status="502"}'] == 1
        # the dead decode leaves no healthy decode: the next request gets a clear error, not a hang
        assert_clear(await batch(r.url, [body(LONG_PROMPT), body(SHORT_PROMPT)]))
    finally:
        r.stop()
        doomed.stop()


async def test_fleet_change_keeps_inflight_streams(router: Router, fleet: dict[str, EngineProcess]) -> None:
    for d in ("d-a", "d-b"):
        set_faults(fleet[d], slowdown=4.0)  # ~1.5 s streams
    try:

        async def shrink_fleet() -> None:
            await asyncio.sleep(0.4)
            assert sum(e["inflight"] for e in router.endpoints().values()) > 0
            router.write_fleet(
                view([endpoint("p-a", "prefill", fleet["p-a"]), endpoint("d-b", "decode", fleet["d-b"])], generation=2)
            )
            deadline = time.monotonic() + 5
            while router.metrics()["pdfleet_router_fleet_generation"] != 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            rows = router.endpoints()
            assert {"p-a", "d-b"} <= set(rows)
            # the removed decode still carries streams: listed as draining until they finish
            assert rows["d-a"]["draining"] and rows["d-a"]["inflight"] > 0, rows
            new = await batch(router.url, [body(SHORT_PROMPT)] * 4)
            assert [s for s, _ in new] == [200] * 4

        streams = [body(LONG_PROMPT + str(i), stream=True, max_tokens=120) for i in range(6)]
        before_a = engine_count(fleet["d-a"], "vllm:e2e_request_latency_seconds_count")
        results = await batch(router.url, streams, during=shrink_fleet())
        for status, text in results:
            assert status == 200 and sse_events(text)[-1] == "[DONE]", text[-300:]
        assert router.metrics()["pdfleet_router_fleet_generation"] == 2
        # the removed decode finished its streams, then got nothing more and left the endpoint list
        assert engine_count(fleet["d-a"], "vllm:e2e_request_latency_seconds_count") - before_a <= 6
        assert set(router.endpoints()) == {"p-a", "d-b"}
        # the admin API swaps views too
        resp = httpx.put(
            router.admin + "/admin/fleet", json=full_view(fleet, generation=3), headers=router.admin_headers
        )
        assert (
            resp.status_code == 200
            and httpx.get(router.admin + "/admin/fleet", headers=router.admin_headers).json()["generation"] == 3
        )
        assert (
            httpx.put(router.admin + "/admin/fleet", content=b"{bad", headers=router.admin_headers).status_code == 400
        )
        # a pushed view is not replaced by an older one, pushed or from the file the kubelet syncs later
        assert (
            httpx.put(
                router.admin + "/admin/fleet",
                json={**full_view(fleet, generation=3), "revision": 5},
                headers=router.admin_headers,
            ).status_code
            == 200
        )
        stale = httpx.put(
            router.admin + "/admin/fleet",
            json={**full_view(fleet, generation=3), "revision": 4},
            headers=router.admin_headers,
        )
        assert stale.status_code == 409 and "older" in stale.json()["error"]["message"]
        reloads = router.metrics()["pdfleet_router_fleet_reloads_total"]
        router.write_fleet({**full_view(fleet, generation=3), "revision": 4})
        time.sleep(1.5)  # the file watcher polls every second
        assert httpx.get(router.admin + "/admin/fleet", headers=router.admin_headers).json()["revision"] == 5
        assert router.metrics()["pdfleet_router_fleet_reloads_total"] == reloads
    finally:
        for d in ("d-a", "d-b"):
            set_faults(fleet[d], slowdown=1.0)


async def test_draining_endpoint_gets_no_new_work(router: Router, fleet: dict[str, EngineProcess]) -> None:
    router.write_fleet(full_view(fleet, generation=2, draining=("d-a", "p-b")))
    deadline = time.monotonic() + 5
    while not router.endpoints()["d-a"]["draining"] and time.monotonic() < deadline:
        time.sleep(0.05)
    before = {n: engine_count(p, "vllm:e2e_request_latency_seconds_count") for n, p in fleet.items()}
    results = await batch(router.url, [body(LONG_PROMPT + str(i)) for i in range(8)] + [body(SHORT_PROMPT)] * 4)
    assert [s for s, _ in results] == [200] * 12
    after = {n: engine_count(p, "vllm:e2e_request_latency_seconds_count") for n, p in fleet.items()}
    assert after["d-a"] == before["d-a"] and after["p-b"] == before["p-b"]
    assert after["d-b"] - before["d-b"] == 12
    m = router.metrics()  # p-a (rack-a) paired with d-b (rack-b) in the same zone
    assert m['pdfleet_router_pairs_total{locality="same_zone"}'] == 8


async def test_client_disconnect_cancels_upstream_legs(router: Router, fleet: dict[str, EngineProcess]) -> None:
    async with httpx.AsyncClient(timeout=REQUEST_BOUND_S) as client:
        async with client.stream(
            "POST", router.url + "/v1/completions", json=body(LONG_PROMPT, stream=True, max_tokens=1000)
        ) as resp:
            async for _ in resp.aiter_bytes():
                break  # first bytes arrived: walk away mid-stream
    deadline = time.monotonic() + 5
    while sum(e["inflight"] for e in router.endpoints().values()) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert sum(e["inflight"] for e in router.endpoints().values()) == 0
    deadline = time.monotonic() + 5  # the decode saw the cancel and stopped generating
    while any(engine_count(fleet[d], "vllm:num_requests_running") for d in ("d-a", "d-b")):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def test_health_checks_take_endpoints_out_and_back(router: Router, fleet: dict[str, EngineProcess]) -> None:
    def healthy(name: str) -> bool:
        return router.endpoints()[name]["healthy"]

    async def wait_for(name: str, state: bool) -> None:
        deadline = time.monotonic() + 5
        while healthy(name) != state:
            assert time.monotonic() < deadline, f"{name} never became healthy={state}"
            await asyncio.sleep(0.05)

    set_faults(fleet["d-b"], unhealthy=True)  # GET /health answers 503
    try:
        await wait_for("d-b", False)
        before = engine_count(fleet["d-b"], "vllm:e2e_request_latency_seconds_count")
        results = await batch(router.url, [body(SHORT_PROMPT)] * 4 + [body(LONG_PROMPT)] * 2)
        assert [s for s, _ in results] == [200] * 6
        assert engine_count(fleet["d-b"], "vllm:e2e_request_latency_seconds_count") == before
    finally:
        set_faults(fleet["d-b"], unhealthy=False)
    await wait_for("d-b", True)
    assert router.metrics()['pdfleet_router_endpoint_healthy{endpoint="d-b",pool="decode"}'] == 1
