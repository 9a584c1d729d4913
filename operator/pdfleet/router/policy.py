"""Pure routing choices: disaggregate or not, which prefill, which decode. No sockets, no clocks.

Token estimate: one token per 4 characters of prompt text (the usual English BPE ratio), plus 4 tokens of chat
template per chat message; a prompt given as token ids counts exactly. It only picks the path, so cheap beats exact.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable, Iterable, Protocol, Sequence, TypeVar

CHARS_PER_TOKEN = 4
CHAT_TOKENS_PER_MESSAGE = 4
# prefix hashing looks at no more than this many leading blocks: enough to tell shared system prompts apart
MAX_PREFIX_BLOCKS = 16
# a prefill keeps its prefix affinity while its in-flight count <= least + SLACK: a looser bound piled bursts of long
# prompts sharing a first block onto one prefill (simulated p50 TTFT 1.8x affinity off; issue 13)
AFFINITY_LOAD_SLACK = 1

SAME_RACK, SAME_ZONE, CROSS_ZONE = "same_rack", "same_zone", "cross_zone"


class Candidate(Protocol):
    """What routing needs to know about an endpoint (EndpointState satisfies it)."""

    name: str
    rack: str
    zone: str
    healthy: bool
    draining: bool
    inflight: int


C = TypeVar("C", bound=Candidate)


def prompt_of(body: dict[str, Any]) -> str | list[Any]:
    """The prompt of a completions or chat request: text, or a list of token ids. Empty when absent."""
    messages = body.get("messages")
    if isinstance(messages, list):
        return "".join(_message_text(m) for m in messages)
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]  # a batch: the first prompt stands for routing
    return prompt if isinstance(prompt, (str, list)) else ""


def _message_text(message: Any) -> str:
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, list):  # multi-part content: only text parts count
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return f"<{message.get('role', '')}>{content if isinstance(content, str) else ''}"


def estimate_prompt_tokens(body: dict[str, Any], prompt: str | list[Any]) -> int:
    """Cheap prompt-length estimate in tokens (see module docstring)."""
    if isinstance(prompt, list):
        return len(prompt)
    tokens = -(-len(prompt) // CHARS_PER_TOKEN)
    messages = body.get("messages")
    if isinstance(messages, list):
        tokens += CHAT_TOKENS_PER_MESSAGE * len(messages)
    return tokens


def should_disaggregate(estimated_tokens: int, min_prompt_tokens: int, prefills: Sequence[Candidate]) -> bool:
    """Short prompts go straight to a decode instance, which does both phases; so does every prompt while the prefill
    pool has no endpoint that is not draining (autoscaled to zero, or on its way there): that is the fleet's chosen
    shape, not a failed prefill (which falls back)."""
    return estimated_tokens >= min_prompt_tokens and any(not c.draining for c in prefills)


def prefix_block_hashes(prompt: str | list[Any], block_tokens: int) -> tuple[int, ...]:
    """Chained hashes of the leading full prompt blocks: entry k identifies the first k+1 blocks."""
    size = block_tokens if isinstance(prompt, list) else block_tokens * CHARS_PER_TOKEN
    count = min(len(prompt) // size, MAX_PREFIX_BLOCKS)
    blocks = (prompt[k * size : (k + 1) * size] for k in range(count))
    return chain_hashes(tuple(block) if isinstance(block, list) else block for block in blocks)


def chain_hashes(blocks: Iterable[Hashable]) -> tuple[int, ...]:
    """Chained hashes of a prompt's blocks in order: entry k identifies the first k+1 blocks."""
    hashes: list[int] = []
    chained = 0
    for block in blocks:
        chained = hash((chained, block))
        hashes.append(chained)
    return tuple(hashes)


class PrefixAffinity:
    """Bounded LRU map prefix-hash -> prefill name: where a prompt prefix was last prefilled (its KV is cached)."""

    def __init__(self, capacity: int = 65536) -> None:
        self.capacity = capacity
        self._owner: OrderedDict[Hashable, str] = OrderedDict()

    def lookup(self, hashes: Sequence[Hashable]) -> str | None:
        """The prefill that last served the longest known prefix, if any."""
        for h in reversed(hashes):
            name = self._owner.get(h)
            if name is not None:
                return name
        return None

    def record(self, hashes: Sequence[Hashable], name: str) -> None:
        """Remember that `name` now holds every prefix in `hashes`."""
        owner = self._owner
        for h in hashes:
            owner[h] = name
            owner.move_to_end(h)
        while len(owner) > self.capacity:
            owner.popitem(last=False)

    def __len__(self) -> int:
        return len(self._owner)


def eligible(candidates: Sequence[C], excluded: frozenset[str] | set[str] = frozenset()) -> list[C]:
    """Healthy, non-draining candidates not excluded by earlier attempts of this request."""
    return [c for c in candidates if c.healthy and not c.draining and c.name not in excluded]


def least_loaded(candidates: Sequence[C], tiebreak: int) -> C | None:
    """Least in-flight candidate; ties rotate by `tiebreak` so equal load spreads evenly."""
    if not candidates:
        return None
    lowest = min(c.inflight for c in candidates)
    ties = [c for c in candidates if c.inflight == lowest]
    return ties[tiebreak % len(ties)]


def affinity_load_bound(least_inflight: int) -> int:
    """Highest in-flight count at which a prefill keeps its prefix affinity."""
    return least_inflight + AFFINITY_LOAD_SLACK


def choose_prefill(
    prefills: Sequence[C], excluded: set[str] | frozenset[str], affinity: str | None, tiebreak: int
) -> C | None:
    """Prefix-affine prefill while it is not overloaded relative to the least loaded, else the least loaded."""
    pool = eligible(prefills, excluded)
    if not pool:
        return None
    if affinity is not None:
        bound = affinity_load_bound(min(c.inflight for c in pool))
        for c in pool:
            if c.name == affinity and c.inflight <= bound:
                return c
    return least_loaded(pool, tiebreak)


def locality_of(prefill: Candidate, decode: Candidate) -> str:
    """Where a decode sits relative to a prefill; an empty rack or zone never matches."""
    if prefill.rack and prefill.rack == decode.rack:
        return SAME_RACK
    if prefill.zone and prefill.zone == decode.zone:
        return SAME_ZONE
    return CROSS_ZONE


def choose_decode(
    decodes: Sequence[C], prefill: Candidate, locality: str, excluded: set[str] | frozenset[str], tiebreak: int
) -> tuple[C | None, str]:
    """Decode for a prefill under the locality policy; returns (decode or None, its locality class).

    required: same rack only. preferred: same rack, else same zone, else any. any: least loaded anywhere.
    """
    pool = eligible(decodes, excluded)
    if locality == "any":
        chosen = least_loaded(pool, tiebreak)
        return chosen, (locality_of(prefill, chosen) if chosen is not None else SAME_RACK)
    tiers = (SAME_RACK,) if locality == "required" else (SAME_RACK, SAME_ZONE, CROSS_ZONE)
    for tier in tiers:
        chosen = least_loaded([d for d in pool if locality_of(prefill, d) == tier], tiebreak)
        if chosen is not None:
            return chosen, tier
    return None, tiers[-1]


def choose_direct_decode(decodes: Sequence[C], excluded: set[str] | frozenset[str], tiebreak: int) -> C | None:
    """Decode that serves a whole request (short prompt or fallback): least loaded anywhere."""
    return least_loaded(eligible(decodes, excluded), tiebreak)
