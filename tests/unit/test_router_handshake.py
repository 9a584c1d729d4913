"""Two-stage handshake bodies (pdfleet.router.handshake)."""

from __future__ import annotations

import json

from pdfleet.router.handshake import (
    PREFILL_KV_TRANSFER_PARAMS,
    decode_request_body,
    error_body,
    kv_transfer_params_json,
    prefill_request_body,
    sse_error_event,
)


def test_prefill_body_asks_for_one_token_and_remote_decode() -> None:
    body = {
        "model": "m",
        "prompt": "hi",
        "max_tokens": 99,
        "min_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.5,
    }
    stage1 = json.loads(prefill_request_body(body))
    assert stage1 == {
        "model": "m",
        "prompt": "hi",
        "max_tokens": 1,
        "stream": False,
        "temperature": 0.5,
        "kv_transfer_params": PREFILL_KV_TRANSFER_PARAMS,
    }
    assert PREFILL_KV_TRANSFER_PARAMS == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    assert body["max_tokens"] == 99  # the client's body is not modified
    chat = json.loads(prefill_request_body({"messages": [], "max_completion_tokens": 50}))
    assert chat["max_completion_tokens"] == 1 and chat["max_tokens"] == 1


def test_kv_params_are_taken_raw_from_the_prefill_reply() -> None:
    params = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "remote_host": "10.0.0.1", "remote_port": 8000}
    reply = json.dumps(
        {"id": "x", "choices": [{"text": 'é "kv_transfer_params"'}], "kv_transfer_params": params}, ensure_ascii=False
    ).encode()
    raw = kv_transfer_params_json(reply)
    assert raw is not None and json.loads(raw) == params
    assert kv_transfer_params_json(b'{"id": "x"}') is None
    assert kv_transfer_params_json(b'{"kv_transfer_params": null}') is None
    assert kv_transfer_params_json(b'{"kv_transfer_params": {"a": ') is None


def test_decode_body_splices_params_into_the_original_bytes() -> None:
    original = b' {"model": "m", "prompt": "long prompt", "stream": true}'
    parsed = json.loads(original)
    stage2 = decode_request_body(original, parsed, b'{"remote_block_ids":[3]}')
    assert json.loads(stage2) == {**parsed, "kv_transfer_params": {"remote_block_ids": [3]}}
    assert stage2.endswith(b'"prompt": "long prompt", "stream": true}')
    assert json.loads(decode_request_body(b"{}", {}, b"{}")) == {"kv_transfer_params": {}}


def test_decode_body_replaces_client_sent_params() -> None:
    original = b'{"prompt": "p", "kv_transfer_params": {"mine": 1}}'
    stage2 = json.loads(decode_request_body(original, json.loads(original), b'{"theirs": 2}'))
    assert stage2 == {"prompt": "p", "kv_transfer_params": {"theirs": 2}}


def test_error_shapes() -> None:
    assert json.loads(error_body(503, "no decode")) == {
        "error": {"message": "no decode", "type": "router_error", "code": 503}
    }
    event = sse_error_event("decode died")
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert json.loads(event[6:])["error"]["message"] == "decode died"
