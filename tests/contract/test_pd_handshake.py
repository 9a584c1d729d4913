"""Contract: vLLM's two-stage PD handshake exactly as the router makes it (pdfleet.router.handshake builds both bodies):
what the prefill returns in kv_transfer_params, what the decode accepts, and what a failed KV pull looks like."""

from __future__ import annotations

import json
import uuid

import pytest
from contract_support import (
    EMULATOR_KV_PARAMS_EXTENSIONS,
    METRICS_SETTLE_S,
    PREFILL_KV_PARAMS_TYPES,
    Pair,
    post,
    scrape,
    stream_chunks,
    wait_for,
)

from pdfleet.localfleet.processes import free_port
from pdfleet.router import handshake
from pdfleet.testing.engine_process import free_loopback_host

MAX_TOKENS = 16
UNREACHABLE_BOUND_S = 30.0  # vLLM gives up on a NIXL handshake after about 5 s (zmq receive timeout)


def long_prompt(tag: str, words: int = 200) -> str:
    """A prompt of a few hundred tokens (several KV blocks on either engine), unique per test so that no prefix cache
    of an earlier test serves it."""
    return f"Contract {tag} {uuid.uuid4().hex[:8]}: " + " ".join(f"w{i % 97}" for i in range(words))


def request_body(pair: Pair, kind: str, prompt: str, stream: bool) -> dict:
    body: dict = {"model": pair.model, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return body


def path(kind: str) -> str:
    return "/v1/chat/completions" if kind == "chat" else "/v1/completions"


def stage1(pair: Pair, kind: str, body: dict) -> tuple[dict, bytes]:
    """The router's stage 1 on the prefill: (reply body, raw kv_transfer_params JSON the router would forward)."""
    reply = post(pair.prefill, path(kind), handshake.prefill_request_body(body))
    assert reply.status_code == 200, reply.text
    kv_json = handshake.kv_transfer_params_json(reply.content)
    assert kv_json is not None, reply.text  # the router finds the object in the raw reply
    return reply.json(), kv_json


def answer_text(kind: str, body: dict) -> str:
    choice = body["choices"][0]
    return choice["message"]["content"] if kind == "chat" else choice["text"]


def stream_text(kind: str, chunks: list[dict]) -> str:
    pieces = []
    for chunk in chunks:
        for choice in chunk["choices"]:
            pieces.append((choice["delta"].get("content") or "") if kind == "chat" else choice["text"])
    return "".join(pieces)


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_prefill_returns_nixl_kv_transfer_params(pair: Pair, kind: str) -> None:
    body = request_body(pair, kind, long_prompt("prefill-params"), stream=False)
    reply, kv_json = stage1(pair, kind, body)
    params = reply["kv_transfer_params"]
    assert json.loads(kv_json) == params
    assert reply["usage"]["completion_tokens"] == 1  # stage 1 generates one token
    assert reply["choices"][0]["finish_reason"] == "length"
    expected = set(PREFILL_KV_PARAMS_TYPES)
    extra = set(params) - expected
    assert expected <= set(params), f"missing {sorted(expected - set(params))}"
    assert extra <= (EMULATOR_KV_PARAMS_EXTENSIONS if pair.impl == "emulator" else set()), sorted(extra)
    for key, kind_ in PREFILL_KV_PARAMS_TYPES.items():
        value = params[key]
        if kind_ is None:
            assert value is None, (key, value)
        else:
            assert isinstance(value, kind_) and (kind_ is bool or not isinstance(value, bool)), (key, value)
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["transfer_mode"] == "pull"
    # one block list per KV cache group (one group for a plain decoder), every block of the prompt offered
    groups = params["remote_block_ids"]
    assert len(groups) == 1 and groups[0] and all(isinstance(b, int) and not isinstance(b, bool) for b in groups[0])
    assert params["remote_num_tokens"] == reply["usage"]["prompt_tokens"]
    assert params["remote_host"] == pair.prefill.host  # its own address, not localhost
    assert 0 < params["remote_port"] < 65536
    assert params["tp_size"] == 1 and params["dcp_size"] == 1 and params["pp_size"] == 1
    assert params["remote_engine_id"] and params["remote_request_id"]


@pytest.mark.parametrize(("kind", "stream"), [("completion", False), ("completion", True), ("chat", False),
                                              ("chat", True)])  # fmt: skip
def test_decode_with_prefill_params_is_token_identical_and_pulls_kv(pair: Pair, kind: str, stream: bool) -> None:
    prompt = long_prompt(f"pd-{kind}-{stream}")
    body = request_body(pair, kind, prompt, stream)
    before = scrape(pair.decode)
    _, kv_json = stage1(pair, kind, body)
    original = json.dumps(body).encode()
    answer = post(pair.decode, path(kind), handshake.decode_request_body(original, body, kv_json))
    assert answer.status_code == 200, answer.text
    # the same request straight to the decode; cache_salt keeps vLLM from reusing the prefix it just received
    direct_body = {**request_body(pair, kind, prompt, stream=False), "cache_salt": "contract-direct"}
    direct = post(pair.decode, path(kind), direct_body)
    assert direct.status_code == 200, direct.text
    direct_json = direct.json()
    if stream:
        chunks = stream_chunks(answer)
        assert chunks[-1]["choices"] == []
        usage = chunks[-1]["usage"]
        text = stream_text(kind, chunks[:-1])
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    else:
        usage = answer.json()["usage"]
        text = answer_text(kind, answer.json())
        assert answer.json()["kv_transfer_params"] is None
    assert text == answer_text(kind, direct_json)  # token-identical to a direct call
    assert usage["completion_tokens"] == MAX_TOKENS
    assert usage["prompt_tokens"] == direct_json["usage"]["prompt_tokens"]

    def transferred():
        now = scrape(pair.decode)
        moved = now.value("vllm:nixl_xfer_time_seconds_count") - before.value("vllm:nixl_xfer_time_seconds_count")
        return now if moved >= 1 else None

    after = wait_for(transferred, METRICS_SETTLE_S, "the decode to count a NIXL transfer")
    assert after.value("vllm:nixl_bytes_transferred_sum") > before.value("vllm:nixl_bytes_transferred_sum")
    failed = "vllm:nixl_num_failed_transfers_total"
    assert after.value(failed) == before.value(failed)


def test_decode_fails_cleanly_when_the_prefill_is_unreachable(pair: Pair) -> None:
    """kv_load_failure_policy fail (the default): no token, HTTP 500, a failed transfer and an error counted, and the
    engine goes on serving (the router retries on another decode or falls back)."""
    prompt = long_prompt("unreachable")
    body = request_body(pair, "completion", prompt, stream=False)
    reply, _ = stage1(pair, "completion", body)
    dead_host = free_loopback_host(taken=[pair.prefill.host, pair.decode.host])
    # the prefill's own answer, pointed at an engine nobody runs, at an address nothing listens on
    params = {
        **reply["kv_transfer_params"],
        "remote_engine_id": str(uuid.uuid4()),  # vLLM caches handshakes per engine id: a fresh one must handshake
        "remote_host": dead_host,
        "remote_port": free_port(dead_host),
    }
    before = scrape(pair.decode)
    answer = post(pair.decode, "/v1/completions", {**body, "kv_transfer_params": params}, timeout=UNREACHABLE_BOUND_S)
    assert answer.status_code == 500, answer.text
    error = answer.json()["error"]
    assert error["type"] == "InternalServerError" and error["code"] == 500

    def counted():
        now = scrape(pair.decode)
        failed = now.value("vllm:nixl_num_failed_transfers_total") - before.value(
            "vllm:nixl_num_failed_transfers_total"
        )
        errors = now.value("vllm:request_success_total", finished_reason="error") - before.value(
            "vllm:request_success_total", finished_reason="error"
        )
        return (failed, errors) if failed >= 1 and errors >= 1 else None

    failed, errors = wait_for(counted, METRICS_SETTLE_S, "a failed transfer and an error to be counted")
    assert errors == 1  # one request failed (vLLM may count the failed handshake and the transfer separately)
    again = post(pair.decode, "/v1/completions", {**body, "max_tokens": 2})
    assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 2
