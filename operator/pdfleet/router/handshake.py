"""Pure bodies of vLLM's two-stage PD handshake and of the router's own error replies.

Stage 1 (prefill): the client's request with max_tokens=1, no min_tokens, stream off and kv_transfer_params asking the
prefill to keep its KV for a remote decode. Stage 2 (decode): the client's original bytes with the prefill's
kv_transfer_params spliced in, so a large prompt is serialized once, not twice.
"""

from __future__ import annotations

import json
from typing import Any

# what a prefill must be told so that it holds the KV blocks for a remote decode (vLLM NixlConnector semantics)
PREFILL_KV_TRANSFER_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
_DROPPED_FOR_PREFILL = ("min_tokens", "stream_options")
_KV_KEY = b'"kv_transfer_params"'
# one encoder/decoder each: json.dumps with non-default options builds a new encoder on every call
_ENCODER = json.JSONEncoder(separators=(",", ":"))
_DECODER = json.JSONDecoder()


def prefill_request_body(body: dict[str, Any]) -> bytes:
    """Stage-1 body: generate one token, no stream, keep the KV for a remote decode."""
    stage1 = {k: v for k, v in body.items() if k not in _DROPPED_FOR_PREFILL}
    stage1["max_tokens"] = 1
    if "max_completion_tokens" in stage1:
        stage1["max_completion_tokens"] = 1
    stage1["stream"] = False
    stage1["kv_transfer_params"] = PREFILL_KV_TRANSFER_PARAMS
    return _ENCODER.encode(stage1).encode()


def kv_transfer_params_json(prefill_reply: bytes) -> bytes | None:
    """The raw JSON text of the prefill reply's kv_transfer_params object, or None if absent or not an object.

    Parses only that object: an unescaped `"kv_transfer_params"` followed by `:` can only be a key, and vLLM puts it
    at the top level of the reply.
    """
    key = prefill_reply.find(_KV_KEY)
    if key < 0:
        return None
    text = prefill_reply[key + len(_KV_KEY) :].decode(errors="replace")  # only the tail: the key is ASCII
    start = 0
    while start < len(text) and text[start] in " \t\r\n:":
        start += 1
    if not text.startswith("{", start):
        return None
    try:
        params, end = _DECODER.raw_decode(text, start)
    except ValueError:
        return None
    return text[start:end].encode() if isinstance(params, dict) else None


def decode_request_body(original: bytes, parsed: dict[str, Any], kv_params: bytes) -> bytes:
    """Stage-2 body: the original request plus the prefill's kv_transfer_params (raw JSON object text).

    Splices the params in front of the original keys (no re-serialization of the prompt) unless the client itself sent
    kv_transfer_params, which would then collide; in that case the object is re-serialized once.
    """
    start = original.find(b"{")
    if "kv_transfer_params" in parsed or start < 0:
        merged = {**parsed, "kv_transfer_params": json.loads(kv_params)}
        return _ENCODER.encode(merged).encode()
    rest = original[start + 1 :].lstrip()
    separator = b"" if rest.startswith(b"}") else b","
    return b'{"kv_transfer_params":' + kv_params + separator + rest


def error_body(status: int, message: str, kind: str = "router_error") -> bytes:
    """OpenAI-style JSON error object."""
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


def sse_error_event(message: str) -> bytes:
    """One SSE event carrying an error, for a stream that cannot be completed."""
    return b"data: " + error_body(502, message, "upstream_error") + b"\n\n"
