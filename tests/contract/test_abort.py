"""Contract: what an engine does when a client goes away mid-request, and when a prefill's KV is never pulled.

The router relies on both: a client disconnect must free the engine's slot (num_requests_running back to 0, the
generation stopped), and KV a prefill holds for a decode that never comes must be released after the NIXL lease
(kv_connector_extra_config.kv_lease_duration, set short for this suite) so that the prefill's KV cache does not fill.
"""

from __future__ import annotations

import json
import socket
import uuid

import httpx
from contract_support import METRICS_SETTLE_S, REQUEST_TIMEOUT_S, Pair, post, scrape, wait_for

from pdfleet.router import handshake

LONG_OUTPUT = 1900  # tokens asked for; both engines need many seconds for them (max_model_len 2048)
CHUNKS_BEFORE_DISCONNECT = 3
ABORT_BOUND_S = 10.0  # the engine must have stopped the request this long after the client left


def long_request(pair: Pair, tag: str, stream: bool) -> dict:
    body = {"model": pair.model, "prompt": f"Abort probe {tag} {uuid.uuid4().hex[:8]}", "max_tokens": LONG_OUTPUT,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    return {**body, "stream": True} if stream else body


def running(pair: Pair) -> float:
    return scrape(pair.decode).value("vllm:num_requests_running")


def check_aborted(pair: Pair, before_generated: float, before_aborts: float) -> None:
    """The request left the running batch within the bound, far short of its tokens; the engine still serves."""
    wait_for(lambda: running(pair) == 0, ABORT_BOUND_S, "num_requests_running back to 0")
    after = scrape(pair.decode)
    generated = after.value("vllm:generation_tokens_total") - before_generated
    assert generated < LONG_OUTPUT / 2, f"{generated} tokens generated after the client left"
    aborts = after.value("vllm:request_success_total", finished_reason="abort") - before_aborts
    assert aborts == 0  # vLLM 0.32 does not count a client's abort among finished requests
    served = post(pair.decode, "/v1/completions", {"model": pair.model, "prompt": "still there?", "max_tokens": 2})
    assert served.status_code == 200 and served.json()["usage"]["completion_tokens"] == 2


def test_client_disconnect_mid_stream_stops_the_request(pair: Pair) -> None:
    before = scrape(pair.decode)
    received = 0
    with httpx.stream(
        "POST", pair.decode.url + "/v1/completions", json=long_request(pair, "stream", True), timeout=REQUEST_TIMEOUT_S
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                received += 1
            if received >= CHUNKS_BEFORE_DISCONNECT:
                break  # leaving the block closes the connection mid-stream
    assert received == CHUNKS_BEFORE_DISCONNECT
    check_aborted(
        pair,
        before.value("vllm:generation_tokens_total"),
        before.value("vllm:request_success_total", finished_reason="abort"),
    )


def test_client_disconnect_before_a_non_stream_answer_stops_the_request(pair: Pair) -> None:
    before = scrape(pair.decode)
    # a raw connection, so that the client leaves exactly when the request is seen running, however slow the engine
    url = httpx.URL(pair.decode.url)
    body = json.dumps(long_request(pair, "non-stream", False)).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {url.host}:{url.port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((url.host, url.port), timeout=REQUEST_TIMEOUT_S) as client:
        client.sendall(head + body)
        wait_for(lambda: running(pair) >= 1, REQUEST_TIMEOUT_S, "the request to run", interval=0.05)
        client.setblocking(False)
        try:
            assert client.recv(1) == b"", "the long request answered before the client left"
        except BlockingIOError:
            pass  # nothing answered yet: the client leaves while the engine works
    check_aborted(
        pair,
        before.value("vllm:generation_tokens_total"),
        before.value("vllm:request_success_total", finished_reason="abort"),
    )


def test_unpulled_prefill_kv_is_released_after_the_lease(pair: Pair) -> None:
    prefill = pair.prefill
    before = scrape(prefill)
    body = {"model": pair.model, "prompt": f"Never pulled {uuid.uuid4().hex[:8]}: " + "a b c d " * 100,
            "max_tokens": 8, "temperature": 0, "ignore_eos": True}  # fmt: skip
    reply = post(prefill, "/v1/completions", handshake.prefill_request_body(body))
    assert reply.status_code == 200, reply.text
    params = reply.json()["kv_transfer_params"]
    assert params["remote_block_ids"][0]
    expired, usage = "vllm:nixl_num_kv_expired_reqs_total", "vllm:kv_cache_usage_perc"
    # seen before the lease ends (a loaded machine can delay vLLM's stats by seconds; CI once missed a 5 s wait)
    held = wait_for(
        lambda: (m := scrape(prefill)).value(usage) > before.value(usage) and m,
        0.8 * pair.lease_s,
        "the held blocks in KV usage",
    )
    assert held.value(expired) == before.value(expired)

    def tick() -> None:  # an engine step: vLLM reaps expired leases and publishes connector stats only in steps
        post(prefill, "/v1/completions", {"model": pair.model, "prompt": "tick", "max_tokens": 1}).raise_for_status()

    def released():
        tick()
        now = scrape(prefill)
        return now if now.value(expired) > before.value(expired) else None

    after = wait_for(released, pair.lease_s + METRICS_SETTLE_S, "the prefill to release the unpulled KV", interval=1.0)
    assert after.value(expired) == before.value(expired) + 1
    assert after.value(usage) <= before.value(usage)
    # a decode that comes after the lease still reads the blocks (a NIXL read cannot be refused; their content may be
    # stale): the request completes and the prefill counts a notification for a request it no longer tracks
    late = "vllm:nixl_num_notifications_after_expiry_total"
    stale = post(pair.decode, "/v1/completions", {**body, "kv_transfer_params": params})
    assert stale.status_code == 200, stale.text
    assert stale.json()["usage"]["completion_tokens"] == 8

    def counted_late():
        tick()  # vLLM publishes connector stats with its next engine-core output
        return scrape(prefill).value(late) == before.value(late) + 1

    wait_for(counted_late, METRICS_SETTLE_S, "the prefill to count the late read", interval=1.0)
