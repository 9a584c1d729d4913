"""OpenAI/vLLM wire format: response bodies, stream chunks and SSE framing, as vLLM 0.32's OpenAI server emits them
(field for field, null-valued fields included: the key sets are checked against real vLLM by tests/contract).

Pure builders; the HTTP layer only writes what these return. Two request kinds share one set of
helpers: "completion" (/v1/completions, object text_completion) and "chat" (/v1/chat/completions, object
chat.completion[.chunk]).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

SSE_DONE = b"data: [DONE]\n\n"
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def to_json(obj: Any) -> bytes:
    """Compact JSON bytes, as pydantic's model_dump_json writes them."""
    return _dumps(obj).encode()


def sse_event(obj: Any) -> bytes:
    """One server-sent event: `data: {json}` and a blank line."""
    return b"data: " + to_json(obj) + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """vLLM UsageInfo."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def system_fingerprint(version: str, instance: str) -> str:
    """vLLM's system_fingerprint: `vllm-<version>-<8 hex digits of this server instance>`."""
    return f"vllm-{version}-{instance[:8]}"


def error_body(message: str, error_type: str, code: int) -> dict:
    """vLLM ErrorResponse body, e.g. error_body('...', 'BadRequestError', 400)."""
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def _object_name(kind: str, stream: bool) -> str:
    if kind == "chat":
        return "chat.completion.chunk" if stream else "chat.completion"
    return "text_completion"


def _head(kind: str, request_id: str, created: int, model: str, stream: bool) -> dict:
    return {"id": request_id, "object": _object_name(kind, stream), "created": created, "model": model}


def stream_chunk(
    kind: str,
    request_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None = None,
    stop_reason: str | int | None = None,
) -> dict:
    """A content chunk; the last one carries finish_reason (chat chunks carry stop_reason only then, as vLLM does)."""
    if kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        choice["token_ids"] = None
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
            "prompt_token_ids": None,
            "token_ids": None,
        }
    return {**_head(kind, request_id, created, model, True), "choices": [choice]}


def chat_role_chunk(request_id: str, created: int, model: str) -> dict:
    """First chat stream chunk: the assistant role with empty content."""
    choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    return {
        **_head("chat", request_id, created, model, True),
        "choices": [choice],
        "prompt_token_ids": None,
        "prompt_text": None,
    }


def usage_chunk(
    kind: str,
    request_id: str,
    created: int,
    model: str,
    prompt_tokens: int,
    completion_tokens: int,
    fingerprint: str | None = None,
) -> dict:
    """Final stream chunk sent when stream_options.include_usage is true: no choices, only usage."""
    return {
        **_head(kind, request_id, created, model, True),
        "choices": [],
        "usage": {k: v for k, v in usage(prompt_tokens, completion_tokens).items() if v is not None},
        "system_fingerprint": fingerprint,
    }


def stream_body(
    kind: str,
    request_id: str,
    created: int,
    model: str,
    pieces: list[str],
    finish_reason: str,
    stop_reason: str | int | None,
    include_usage: bool,
    prompt_tokens: int,
    fingerprint: str | None = None,
) -> bytes:
    """A whole SSE stream at once (zero-delay mode): role chunk (chat), one chunk per piece, usage, [DONE]."""
    parts = [sse_event(chat_role_chunk(request_id, created, model))] if kind == "chat" else []
    last = len(pieces) - 1
    parts += [
        sse_event(
            stream_chunk(
                kind,
                request_id,
                created,
                model,
                piece,
                finish_reason if i == last else None,
                stop_reason if i == last else None,
            )
        )
        for i, piece in enumerate(pieces)
    ]
    if include_usage:
        parts.append(sse_event(usage_chunk(kind, request_id, created, model, prompt_tokens, len(pieces), fingerprint)))
    parts.append(SSE_DONE)
    return b"".join(parts)


def full_response(
    kind: str,
    request_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    stop_reason: str | int | None,
    prompt_tokens: int,
    completion_tokens: int,
    kv_transfer_params: dict | None = None,
    fingerprint: str | None = None,
) -> dict:
    """Non-stream response body; `kv_transfer_params` is the top-level field a PD prefill answer carries."""
    if kind == "chat":
        message = {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        }
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
            "token_ids": None,
            "routed_experts": None,
        }
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
            "token_ids": None,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "routed_experts": None,
        }
    body = {
        **_head(kind, request_id, created, model, False),
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": usage(prompt_tokens, completion_tokens),
    }
    if kind == "chat":
        body.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
    body.update(kv_transfer_params=kv_transfer_params, ec_transfer_params=None, metrics=None)
    return body


def models_body(served_model_names: list[str], root: str, max_model_len: int, created: int) -> dict:
    """GET /v1/models body."""
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": root,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [_model_permission(created)],
            }
            for name in served_model_names
        ],
    }


def _model_permission(created: int) -> dict:
    return {
        "id": f"modelperm-{uuid.uuid4().hex[:16]}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
