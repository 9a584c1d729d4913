"""Contract: the OpenAI endpoints the router proxies and clients read (completions and chat, streamed or not, usage),
/health and /v1/models."""

from __future__ import annotations

import httpx
import pytest
from contract_support import (
    CHAT_CHOICE_KEYS,
    CHAT_KEYS,
    CHAT_MESSAGE_KEYS,
    COMPLETION_CHOICE_KEYS,
    COMPLETION_KEYS,
    REQUEST_TIMEOUT_S,
    USAGE_KEYS,
    Pair,
    post,
    stream_chunks,
)

MAX_TOKENS = 12


def completion_body(pair: Pair, prompt: str, **extra: object) -> dict:
    return {"model": pair.model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            **extra}  # fmt: skip


def chat_body(pair: Pair, content: str, **extra: object) -> dict:
    return {"model": pair.model, "messages": [{"role": "user", "content": content}], "max_tokens": MAX_TOKENS,
            "temperature": 0, "ignore_eos": True, **extra}  # fmt: skip


def check_usage(usage: dict, completion_tokens: int) -> None:
    assert usage["completion_tokens"] == completion_tokens
    assert usage["prompt_tokens"] >= 1
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_health_answers_200_on_both_engines(pair: Pair) -> None:
    for engine in pair.engines:
        response = httpx.get(engine.url + "/health", timeout=REQUEST_TIMEOUT_S)
        assert response.status_code == 200 and response.content == b""


def test_models_lists_the_served_name(pair: Pair) -> None:
    for engine in pair.engines:
        body = httpx.get(engine.url + "/v1/models", timeout=REQUEST_TIMEOUT_S).json()
        assert body["object"] == "list"
        assert [m["id"] for m in body["data"]] == [pair.model]
        model = body["data"][0]
        assert model["object"] == "model" and model["owned_by"] == "vllm" and model["max_model_len"] == 2048


def test_completion_non_stream(pair: Pair) -> None:
    response = post(pair.decode, "/v1/completions", completion_body(pair, "The quick brown fox"))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == COMPLETION_KEYS
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-") and body["model"] == pair.model
    assert isinstance(body["created"], int)
    assert len(body["choices"]) == 1
    choice = body["choices"][0]
    assert set(choice) == COMPLETION_CHOICE_KEYS
    assert choice["index"] == 0 and isinstance(choice["text"], str) and choice["text"]
    assert choice["finish_reason"] == "length"  # max_tokens honoured (ignore_eos: the model never stops early)
    assert set(body["usage"]) == USAGE_KEYS
    check_usage(body["usage"], MAX_TOKENS)
    assert body["kv_transfer_params"] is None  # no PD request: no KV held


def test_chat_non_stream(pair: Pair) -> None:
    response = post(pair.decode, "/v1/chat/completions", chat_body(pair, "Hello there"))
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == CHAT_KEYS
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-") and body["model"] == pair.model
    choice = body["choices"][0]
    assert set(choice) == CHAT_CHOICE_KEYS and set(choice["message"]) == CHAT_MESSAGE_KEYS
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] == "length"
    check_usage(body["usage"], MAX_TOKENS)
    # max_completion_tokens wins over max_tokens
    capped = post(pair.decode, "/v1/chat/completions", chat_body(pair, "Hello there", max_completion_tokens=3))
    assert capped.status_code == 200 and capped.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("include_usage", [True, False])
def test_completion_stream_matches_non_stream(pair: Pair, include_usage: bool) -> None:
    body = completion_body(pair, "Streaming completions, one token at a time")
    whole = post(pair.decode, "/v1/completions", body).json()
    extra = {"stream_options": {"include_usage": True}} if include_usage else {}
    response = post(pair.decode, "/v1/completions", {**body, "stream": True, **extra})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    chunks = stream_chunks(response)
    assert all(c["object"] == "text_completion" and c["model"] == pair.model for c in chunks)
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("cmpl-")
    content = chunks[:-1] if include_usage else chunks
    if include_usage:  # a final chunk with no choices and the usage
        assert chunks[-1]["choices"] == []
        check_usage(chunks[-1]["usage"], MAX_TOKENS)
        assert chunks[-1]["usage"] == {k: v for k, v in whole["usage"].items() if v is not None}
    else:
        assert all("usage" not in c or c["usage"] is None for c in chunks)
    assert all(len(c["choices"]) == 1 for c in content) and 1 <= len(content) <= MAX_TOKENS
    reasons = [c["choices"][0]["finish_reason"] for c in content]
    assert reasons == [None] * (len(content) - 1) + ["length"]
    assert "".join(c["choices"][0]["text"] for c in content) == whole["choices"][0]["text"]


@pytest.mark.parametrize("include_usage", [True, False])
def test_chat_stream_matches_non_stream(pair: Pair, include_usage: bool) -> None:
    body = chat_body(pair, "Stream a chat answer")
    whole = post(pair.decode, "/v1/chat/completions", body).json()
    extra = {"stream_options": {"include_usage": True}} if include_usage else {}
    response = post(pair.decode, "/v1/chat/completions", {**body, "stream": True, **extra})
    assert response.status_code == 200
    chunks = stream_chunks(response)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[0]["choices"][0]["finish_reason"] is None
    content = chunks[1:-1] if include_usage else chunks[1:]
    if include_usage:
        assert chunks[-1]["choices"] == []
        check_usage(chunks[-1]["usage"], MAX_TOKENS)
    assert 1 <= len(content) <= MAX_TOKENS
    assert all("role" not in c["choices"][0]["delta"] for c in content)
    reasons = [c["choices"][0]["finish_reason"] for c in content]
    assert reasons == [None] * (len(content) - 1) + ["length"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in content)
    assert text == whole["choices"][0]["message"]["content"]


@pytest.mark.parametrize("content_type", ["text/plain", None])
def test_a_body_that_is_not_declared_json_is_rejected(pair: Pair, content_type: str | None) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    body = httpx.Request("POST", "/", json=completion_body(pair, "typed?")).content
    response = httpx.post(pair.decode.url + "/v1/completions", content=body, headers=headers, timeout=REQUEST_TIMEOUT_S)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "Bad Request" and error["code"] == 400
    assert "application/json" in error["message"]
