"""Continuous-batching scheduler of the emulator: one asyncio task runs engine steps like vLLM v1's scheduler.

Each step: running requests first (decode: 1 token each; unfinished prefills: their next chunk), then waiting requests
are admitted FIFO while the token budget (max_num_batched_tokens), max_num_seqs and free KV blocks allow. The step
sleeps its modelled time (timing.step_time), then every request in it advances and new tokens are handed to the
request's TokenStream in one go (no per-token sleeps). A request that cannot grow its KV preempts the newest running
request, which goes back to the queue and is recomputed later (vLLM's recompute preemption).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from pdfleet.engine.faults import Faults
from pdfleet.engine.kvcache import KvBlockPool
from pdfleet.engine.metrics import EngineMetrics
from pdfleet.perfmodel.timing import Hardware, StepLoad, blocks_for, chunk_attention_pairs, step_time

IDLE_RECHECK_S = 0.5  # when work waits only for held KV blocks to expire


@dataclass(eq=False)
class Sequence:
    """One request inside the engine, and the channel its tokens come out of."""

    request_id: str
    prompt_tokens: int
    output_tokens: int  # tokens to generate before finishing
    finish_reason: str  # reason reported when output_tokens are done
    arrival: float
    computed_tokens: int = 0  # prompt tokens whose KV arrived from a remote prefill
    hold_kv: bool = False  # keep the prompt's KV blocks for a remote decode after finishing
    kv_tokens: int = 0
    prefill_target: int = 0
    generated: int = 0
    blocks: int = 0
    queued_at: float = 0.0  # entered the queue (after any KV pull); queue time counts from here
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float = 0.0
    unread: int = 0
    done: bool = False
    aborted: bool = False
    held_block_ids: list[int] = field(default_factory=list)
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.kv_tokens = self.computed_tokens
        self.prefill_target = self.prompt_tokens

    def emit(self, count: int) -> None:
        """Hand `count` new tokens to the reader."""
        self.unread += count
        self.ready.set()

    async def read(self) -> int:
        """Wait for new tokens (or the end) and return how many arrived since the last read."""
        while not self.unread and not self.done:
            self.ready.clear()
            await self.ready.wait()
        count, self.unread = self.unread, 0
        return count


class Scheduler:
    """The step loop; `run()` is the task, `submit()`/`abort()` are called from request handlers."""

    def __init__(
        self,
        hw: Hardware,
        pool: KvBlockPool,
        metrics: EngineMetrics,
        faults: Faults,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        speedup: float,
        kv_hold_ttl_s: float,
    ) -> None:
        self.hw = hw
        self.pool = pool
        self.metrics = metrics
        self.faults = faults
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.speedup = speedup
        self.kv_hold_ttl_s = kv_hold_ttl_s
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.pulling = 0  # requests waiting for their KV pull before they can be queued
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    def now(self) -> float:
        """Engine clock (event-loop monotonic time)."""
        return self._loop.time()

    def submit(self, seq: Sequence) -> None:
        """Queue a request."""
        seq.queued_at = self.now()
        self.waiting.append(seq)
        self.wake()

    def wake(self) -> None:
        """Something changed (new work, freed KV): let an idle loop look again."""
        self._wake.set()

    def abort(self, seq: Sequence) -> None:
        """Drop a request whose client went away (no finish metrics, as vLLM)."""
        if seq.done:
            return
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.running:
            self.running.remove(seq)
        self._finish(seq, self.now(), "abort")

    def publish_state(self) -> None:
        """Push the scheduler gauges."""
        self.metrics.scheduler_state(len(self.running), len(self.waiting) + self.pulling, self.pool.usage)

    async def run(self) -> None:
        """The engine loop: plan a step, sleep its modelled time, apply it; idle-wait when there is nothing to do."""
        step_end: float | None = None
        while True:
            self.pool.expire(self.now())
            prefills, decodes, load = self._plan()
            self.publish_state()
            if not prefills and not decodes:
                step_end = None
                self._wake.clear()
                timeout = IDLE_RECHECK_S if self.waiting else None
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout)
                except asyncio.TimeoutError:
                    pass
                continue
            duration = step_time(self.hw, load) * self.faults.slowdown / self.speedup
            now = self.now()
            # steps follow each other back to back: time lost to our own Python work and timer lateness since the
            # previous step ended (at most one step's worth) comes off this step's sleep
            start = step_end if step_end is not None and now - step_end < duration else now
            step_end = start + duration
            await asyncio.sleep(max(0.0, step_end - now))
            self._apply(prefills, decodes, self.now())

    def _grow(self, seq: Sequence, tokens: int) -> bool:
        need = blocks_for(tokens, self.pool.block_size) - seq.blocks
        if need <= 0:
            return True
        if not self.pool.try_allocate(need):
            return False
        seq.blocks += need
        return True

    def _preempt_newest(self) -> Sequence:
        victim = self.running.pop()
        self.pool.free(victim.blocks)
        victim.blocks = 0
        victim.kv_tokens = 0
        victim.prefill_target = victim.prompt_tokens + victim.generated
        self.waiting.appendleft(victim)
        self.metrics.preemptions.inc()
        return victim

    def _plan(self) -> tuple[list[tuple[Sequence, int]], list[Sequence], StepLoad]:
        budget = self.max_num_batched_tokens
        prefills: list[tuple[Sequence, int]] = []
        decodes: list[Sequence] = []
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            remaining = seq.prefill_target - seq.kv_tokens
            tokens = min(budget, remaining) if remaining > 0 else 1
            while not self._grow(seq, seq.kv_tokens + tokens):
                if self._preempt_newest() is seq:
                    break
            else:
                if remaining > 0:
                    prefills.append((seq, tokens))
                else:
                    decodes.append(seq)
                budget -= tokens
                index += 1
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            tokens = min(budget, seq.prefill_target - seq.kv_tokens)
            if not self._grow(seq, seq.kv_tokens + tokens):
                break
            self.waiting.popleft()
            self.running.append(seq)
            if seq.scheduled_at is None:
                seq.scheduled_at = self.now()
            prefills.append((seq, tokens))
            budget -= tokens
        load = StepLoad(
            prefill_tokens=sum(tokens for _, tokens in prefills),
            prefill_attention_pairs=sum(chunk_attention_pairs(seq.kv_tokens, tokens) for seq, tokens in prefills),
            decode_seqs=len(decodes),
            decode_context_tokens=sum(seq.kv_tokens + 1 for seq in decodes),
        )
        return prefills, decodes, load

    def _apply(self, prefills: list[tuple[Sequence, int]], decodes: list[Sequence], now: float) -> None:
        for seq, tokens in prefills:
            if seq.done:
                continue
            seq.kv_tokens += tokens
            if seq.kv_tokens >= seq.prefill_target:
                self._token(seq, now)
        for seq in decodes:
            if not seq.done:
                seq.kv_tokens += 1
                self._token(seq, now)
        self.publish_state()

    def _token(self, seq: Sequence, now: float) -> None:
        if seq.first_token_at is None:
            seq.first_token_at = now
            self.metrics.first_token(now - seq.arrival, (seq.scheduled_at or now) - seq.queued_at, seq.prompt_tokens)
        else:
            self.metrics.next_tokens(now - seq.last_token_at)
        seq.last_token_at = now
        seq.generated += 1
        seq.emit(1)
        if seq.generated >= seq.output_tokens:
            self.running.remove(seq)
            self._finish(seq, now, seq.finish_reason)

    def _finish(self, seq: Sequence, now: float, reason: str) -> None:
        seq.done = True
        seq.aborted = reason == "abort"
        self.pool.free(seq.blocks)
        seq.blocks = 0
        if seq.hold_kv and not seq.aborted:
            seq.held_block_ids = self.pool.hold(
                seq.request_id, seq.prompt_tokens, now, self.kv_hold_ttl_s / self.speedup
            )
        decode_s = now - seq.first_token_at if seq.first_token_at is not None else 0.0
        if not seq.aborted:
            # a client's abort is not a finished request in vLLM 0.32: its output processor drops the request's state
            # before any finish stats, so neither vllm:request_success_total{finished_reason="abort"} nor the e2e
            # histogram counts it (engine-initiated aborts would, and the emulator has none)
            self.metrics.finished(
                reason, now - seq.arrival, decode_s, seq.generated, seq.prompt_tokens - seq.computed_tokens
            )
        seq.ready.set()
        self.wake()
