"""KV block ledger of one engine: blocks in use by running requests, and blocks a prefill keeps for a remote pull."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

RELEASED_MEMORY = 4096  # holds remembered after release, to tell a late pull of released blocks from a bogus one


@dataclass(frozen=True)
class KvHold:
    """KV blocks of a finished prefill kept until a decode instance pulls them or the TTL runs out."""

    request_id: str
    block_ids: list[int]
    num_tokens: int
    expires_at: float


class KvBlockPool:
    """Counts KV blocks; not thread-safe (one event loop owns it)."""

    def __init__(self, capacity_blocks: int, block_size: int, on_expire: Callable[[int], None] | None = None) -> None:
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
        self.used_blocks = 0
        self._holds: OrderedDict[str, KvHold] = OrderedDict()
        self._released: OrderedDict[str, KvHold] = OrderedDict()
        self._next_block_id = 1
        self._on_expire = on_expire

    @property
    def usage(self) -> float:
        """Fraction of KV blocks in use (vllm:kv_cache_usage_perc), capped at 1."""
        return min(1.0, self.used_blocks / self.capacity_blocks) if self.capacity_blocks else 0.0

    @property
    def free_blocks(self) -> int:
        """Blocks not in use."""
        return max(0, self.capacity_blocks - self.used_blocks)

    def try_allocate(self, blocks: int) -> bool:
        """Take `blocks` blocks if they are free."""
        if blocks > self.free_blocks:
            return False
        self.used_blocks += blocks
        return True

    def free(self, blocks: int) -> None:
        """Return `blocks` blocks."""
        self.used_blocks = max(0, self.used_blocks - blocks)

    def hold(self, request_id: str, num_tokens: int, now: float, ttl_s: float) -> list[int]:
        """Keep the blocks of `num_tokens` prompt tokens for a pull (the lease); returns their ids.

        Like vLLM 0.32's NIXL producer, every block the prompt occupies is offered, the partial last one included.
        The blocks count as used even beyond capacity (they were already allocated by the finished request).
        """
        stale = self._holds.pop(request_id, None)  # a reused request id replaces its older hold
        if stale:
            self.free(len(stale.block_ids))
        count = -(-num_tokens // self.block_size)
        if count <= 0:
            return []
        ids = list(range(self._next_block_id, self._next_block_id + count))
        self._next_block_id += count
        self.used_blocks += count
        self._holds[request_id] = KvHold(request_id, ids, num_tokens, now + ttl_s)
        return ids

    def take(self, request_id: str, block_ids: list[int]) -> KvHold | None:
        """Hand over and free a hold whose ids match; None when unknown, expired or the ids differ."""
        held = self._holds.get(request_id)
        if held is None or list(block_ids) != held.block_ids:
            return None
        del self._holds[request_id]
        self.free(len(held.block_ids))
        self._remember(held)
        return held

    def released(self, request_id: str, block_ids: list[int]) -> KvHold | None:
        """The hold these ids belonged to if it was released (pulled or expired) not long ago, else None."""
        held = self._released.get(request_id)
        return held if held is not None and list(block_ids) == held.block_ids else None

    def _remember(self, held: KvHold) -> None:
        self._released[held.request_id] = held
        while len(self._released) > RELEASED_MEMORY:
            self._released.popitem(last=False)

    def expire(self, now: float) -> int:
        """Free holds whose TTL ran out (holds are kept in expiry order); returns how many."""
        expired = 0
        while self._holds:
            first = next(iter(self._holds.values()))
            if first.expires_at > now:
                break
            self._holds.popitem(last=False)
            self.free(len(first.block_ids))
            self._remember(first)
            expired += 1
        if expired and self._on_expire:
            self._on_expire(expired)
        return expired

    @property
    def held_requests(self) -> int:
        """Number of holds waiting for a pull."""
        return len(self._holds)
