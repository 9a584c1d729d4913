"""Pure bodies of vLLM's two-stage PD handshake and of the router's own error replies.

Stage 1 (prefill): the client's request with max_tokens=1, no min_tokens, stream off and kv_transfer_params asking the
prefill to keep its KV for a remote decode. Stage 2 (decode): the client's original bytes with the prefill's
kv_transfer_params spliced in, so a large prompt is serialized once, not twice.

Engine-internal fields (`INTERNAL_FIELDS`: vLLM's kv_transfer_params and ec_transfer_params, also when smuggled inside
vllm_xargs, which vLLM copies into the same SamplingParams.extra_args) are never taken from a client: they tell an
engine which host to pull KV or encoder cache from. Every body sent to an engine, on every path, is built here
without them; only the router sets kv_transfer_params, and only on the two-stage path.
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
# request fields vLLM treats as PD/EPD plumbing between engines (request.kv_transfer_params, ec_transfer_params); vLLM
# builds SamplingParams.extra_args from vllm_xargs and then adds these, so they are dropped from vllm_xargs as well
INTERNAL_FIELDS = ("kv_transfer_params", "ec_transfer_params")
XARGS_FIELD = "vllm_xargs"
_KV_KEY = b'"kv_transfer_params"'
# one encoder/decoder each: json.dumps with non-default options builds a new encoder on every call
_ENCODER = json.JSONEncoder(separators=(",", ":"))
_DECODER = json.JSONDecoder()


def has_internal_fields(body: dict[str, Any]) -> bool:
    """Whether a client's request carries any engine-internal field (at the top level or inside vllm_xargs)."""
    if "kv_transfer_params" in body or "ec_transfer_params" in body:
        return True
    xargs = body.get(XARGS_FIELD)
    return isinstance(xargs, dict) and ("kv_transfer_params" in xargs or "ec_transfer_params" in xargs)


def without_internal_fields(body: dict[str, Any]) -> dict[str, Any]:
    """A copy of a client's request without engine-internal fields (the request itself is not modified)."""
    clean = {k: v for k, v in body.items() if k not in INTERNAL_FIELDS}
    xargs = clean.get(XARGS_FIELD)
    if isinstance(xargs, dict):
        clean[XARGS_FIELD] = {k: v for k, v in xargs.items() if k not in INTERNAL_FIELDS}
    return clean


def direct_request_body(original: bytes, parsed: dict[str, Any]) -> bytes:
    """Body of a request a decode serves whole (direct path, fallback): the client's bytes as they came when they
    carry no engine-internal field (the common case: no re-serialization), else the request re-serialized without.

    The check runs on the parsed object, so a duplicated or escaped key cannot hide a field from it, and whatever is
    re-serialized is what the router itself parsed."""
    if not has_internal_fields(parsed):
        return original
    return _ENCODER.encode(without_internal_fields(parsed)).encode()


def prefill_request_body(body: dict[str, Any]) -> bytes:
    """Stage-1 body: generate one token, no stream, keep the KV for a remote decode."""
    if has_internal_fields(body):
        body = without_internal_fields(body)
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
    an engine-internal field (kv_transfer_params would also collide); in that case the object is re-serialized once,
    without the client's fields.
    """
    start = original.find(b"{")
    if start < 0 or has_internal_fields(parsed):
        merged = {**without_internal_fields(parsed), "kv_transfer_params": json.loads(kv_params)}
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
