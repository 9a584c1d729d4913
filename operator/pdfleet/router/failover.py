"""Pure failure decisions: given how a leg ended, what the router does next. Fail fast, bounded, never silent."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Outcome(enum.Enum):
    """How one upstream leg ended."""

    OK = "ok"
    CONNECT_FAILED = "connect_failed"  # refused, reset or closed before any response byte
    TIMEOUT = "timeout"
    UPSTREAM_5XX = "upstream_5xx"
    UPSTREAM_4XX = "upstream_4xx"  # the request itself is bad: retrying elsewhere would not help
    BAD_HANDSHAKE = "bad_handshake"  # prefill answered 2xx without kv_transfer_params
    DIED_MID_STREAM = "died_mid_stream"  # some bytes already reached the client: cannot be replayed
    CLIENT_GONE = "client_gone"


class Action(enum.Enum):
    """What the router does next."""

    DONE = "done"
    RETRY = "retry"  # same leg, another endpoint
    FALLBACK = "fallback"  # full prefill on a decode instance (direct path)
    PASS_THROUGH = "pass_through"  # relay the upstream's own error reply
    FAIL = "fail"  # reply with a JSON error (status, message)
    ABANDON = "abandon"  # nothing more to send: client gone or the stream already carries the error


@dataclass(frozen=True)
class Decision:
    """Next step; `status` is the HTTP status for FAIL."""

    action: Action
    status: int = 0


RETRYABLE = frozenset({Outcome.CONNECT_FAILED, Outcome.TIMEOUT, Outcome.UPSTREAM_5XX, Outcome.BAD_HANDSHAKE})
# connection-level failures say the endpoint is unwell; a 5xx may concern only this request (e.g. one KV transfer)
MARKS_UNHEALTHY = frozenset({Outcome.CONNECT_FAILED, Outcome.TIMEOUT, Outcome.DIED_MID_STREAM})


def fail_status(outcome: Outcome) -> int:
    """HTTP status for a leg that failed for good: 504 for timeouts, else 502."""
    return 504 if outcome is Outcome.TIMEOUT else 502


def _common(outcome: Outcome) -> Decision | None:
    if outcome is Outcome.OK:
        return Decision(Action.DONE)
    if outcome is Outcome.UPSTREAM_4XX:
        return Decision(Action.PASS_THROUGH)
    if outcome in (Outcome.CLIENT_GONE, Outcome.DIED_MID_STREAM):
        return Decision(Action.ABANDON)
    return None


def after_prefill(outcome: Outcome, retries_done: int, max_retries: int) -> Decision:
    """Prefill down/5xx/timeout -> another prefill up to max_retries, then a full prefill on a decode instance."""
    decided = _common(outcome)
    if decided is not None:
        return decided
    return Decision(Action.RETRY if retries_done < max_retries else Action.FALLBACK)


def after_decode(outcome: Outcome, retries_done: int, max_retries: int, can_fall_back: bool) -> Decision:
    """Decode failed before its first byte -> another decode up to max_retries, then fallback (if the request
    was disaggregated) or a 502/504 naming the leg."""
    decided = _common(outcome)
    if decided is not None:
        return decided
    if retries_done < max_retries:
        return Decision(Action.RETRY)
    return Decision(Action.FALLBACK) if can_fall_back else Decision(Action.FAIL, fail_status(outcome))


# A non-streamed reply arrives whole, after its last token: on top of the first-byte timeout its first byte may take
# inter_chunk / TOKENS_PER_INTER_CHUNK per requested token. The operator derives the inter-chunk timeout as
# max(5 s, 20 x the SLA's tpotMs), so that is max(0.25 s, the SLA's tpot) per token.
TOKENS_PER_INTER_CHUNK = 20


def first_byte_timeout(first_byte: float, inter_chunk: float, stream: bool, max_tokens: object) -> float:
    """How long a decode or direct leg may wait for the first body byte of its reply; 0.0 means no such bound (only
    the leg's overall timeout holds).

    A stream's first chunk comes once the prompt is in: `first_byte`. A non-streamed reply comes whole, so its wait
    grows by `inter_chunk / TOKENS_PER_INTER_CHUNK` per requested token (`max_tokens`); without a token count (e.g. a
    chat request that leaves max_tokens to the engine) there is no such bound."""
    if stream:
        return first_byte
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        return 0.0
    return first_byte + max_tokens * inter_chunk / TOKENS_PER_INTER_CHUNK
