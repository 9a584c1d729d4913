"""Wire format (SSE framing, vLLM bodies) and the tokenizer stand-in."""

import json

import pytest

from pdfleet.engine import protocol, tokens


def parse_sse(raw: bytes) -> list:
    """Events of an SSE body; every event must be `data: ...` followed by a blank line."""
    text = raw.decode()
    assert text.endswith("\n\n")
    events = text[:-2].split("\n\n")
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: ") :] for e in events]


def test_sse_event_framing_is_compact_json():
    assert protocol.sse_event({"a": 1, "b": [None]}) == b'data: {"a":1,"b":[null]}\n\n'
    assert protocol.SSE_DONE == b"data: [DONE]\n\n"


def test_completion_stream_body_chunks_usage_and_done():
    body = protocol.stream_body("completion", "cmpl-1", 7, "m", ["alpha ", "bravo "], "length", None, True, 12)
    events = parse_sse(body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["text"] for c in chunks[:2]] == ["alpha ", "bravo "]
    first, last, usage = chunks
    assert first == {  # vLLM 0.32's completion chunk, field for field
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 7,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "text": "alpha ",
                "logprobs": None,
                "finish_reason": None,
                "stop_reason": None,
                "prompt_token_ids": None,
                "token_ids": None,
            }
        ],
    }
    assert last["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 12,
        "total_tokens": 14,
        "completion_tokens": 2,
    }
    assert "system_fingerprint" in usage


def test_chat_stream_body_role_chunk_then_deltas_without_usage():
    events = parse_sse(protocol.stream_body("chat", "chatcmpl-1", 7, "m", ["alpha "], "stop", None, False, 5))
    role, content, done = events
    assert done == "[DONE]"
    role, content = json.loads(role), json.loads(content)
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert role["prompt_token_ids"] is None and role["prompt_text"] is None
    assert content["choices"][0] == {
        "index": 0,
        "delta": {"content": "alpha "},
        "logprobs": None,
        "finish_reason": "stop",
        "stop_reason": None,
        "token_ids": None,
    }
    middle = protocol.stream_chunk("chat", "c", 1, "m", "x")
    assert "stop_reason" not in middle["choices"][0]  # vLLM sets it on the final chunk only


def test_full_responses_carry_usage_and_kv_transfer_params():
    params = {"do_remote_prefill": True}
    completion = protocol.full_response("completion", "cmpl-1", 1, "m", "alpha ", "length", None, 10, 1, params)
    assert completion["object"] == "text_completion"
    assert completion["choices"][0]["text"] == "alpha "
    assert completion["usage"] == {
        "prompt_tokens": 10,
        "total_tokens": 11,
        "completion_tokens": 1,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    assert completion["kv_transfer_params"] == params
    assert list(completion) == [  # vLLM 0.32's CompletionResponse keys, in its order
        "id",
        "object",
        "created",
        "model",
        "choices",
        "service_tier",
        "system_fingerprint",
        "usage",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
    ]
    chat = protocol.full_response("chat", "chatcmpl-1", 1, "m", "hi", "stop", None, 3, 1, None, "vllm-0.32.0-abc")
    assert chat["object"] == "chat.completion" and chat["system_fingerprint"] == "vllm-0.32.0-abc"
    assert chat["choices"][0]["message"]["role"] == "assistant" and chat["choices"][0]["message"]["content"] == "hi"
    assert set(chat["choices"][0]["message"]) == {
        "role",
        "content",
        "refusal",
        "annotations",
        "audio",
        "function_call",
        "reasoning",
    }
    assert chat["kv_transfer_params"] is None and chat["prompt_token_ids"] is None


def test_error_and_models_bodies():
    assert protocol.error_body("nope", "NotFoundError", 404) == {
        "error": {"message": "nope", "type": "NotFoundError", "param": None, "code": 404}
    }
    models = protocol.models_body(["a", "b"], "org/model", 4096, 1)
    assert [m["id"] for m in models["data"]] == ["a", "b"] and models["data"][0]["max_model_len"] == 4096


def test_tokenizer_stand_in():
    assert tokens.count_text_tokens("") == 0
    assert tokens.count_text_tokens("abcd") == 1 and tokens.count_text_tokens("abcde") == 2
    assert tokens.prompt_tokens("x" * 400) == 100
    assert tokens.prompt_tokens([1, 2, 3]) == 3
    assert tokens.prompt_tokens(["abcdefgh"]) == 2 and tokens.prompt_tokens([[5, 6]]) == 2
    for bad in (None, 5, ["a", "b"], [], [True]):
        with pytest.raises(ValueError):
            tokens.prompt_tokens(bad)
    messages = [
        {"role": "system", "content": "abcd"},
        {"role": "user", "content": [{"type": "text", "text": "abcdefgh"}]},
    ]
    assert tokens.chat_prompt_tokens(messages) == 3 + (4 + 1) + (4 + 2)
    with pytest.raises(ValueError):
        tokens.chat_prompt_tokens([])


def test_generated_text_is_deterministic_words():
    assert tokens.generated_text(0, 3) == "alpha bravo charlie "
    assert tokens.token_text(len(tokens.WORDS)) == "alpha "
    assert tokens.generated_text(2, 2) == tokens.token_text(2) + tokens.token_text(3)


@pytest.mark.parametrize(
    "max_tokens,min_tokens,ignore_eos,natural,expected",
    [
        (16, 0, False, 256, (16, "length")),
        (512, 0, False, 256, (256, "stop")),
        (512, 300, False, 256, (300, "stop")),
        (512, 0, True, 256, (512, "length")),
        (1, 0, False, 256, (1, "length")),
    ],
)
def test_plan_output(max_tokens, min_tokens, ignore_eos, natural, expected):
    assert tokens.plan_output(max_tokens, min_tokens, ignore_eos, natural) == expected
