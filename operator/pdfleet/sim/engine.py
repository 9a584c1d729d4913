"""One simulated engine instance: vLLM-style continuous batching costed by `pdfleet.perfmodel.timing.step_time`.

Batch-step model, not token events: a step holding prefill work (chunked, up to max_num_batched_tokens, decodes
first) is one event; a run of pure-decode steps with an unchanged batch is one *span* event that ends at the first
sequence to finish. A new arrival cuts the span short after the step in progress. Decode sequences are tracked by a
shared step counter (a sequence finishes when the counter reaches its end mark), so a span costs O(log batch).

Admission reserves KV for prompt + output tokens (no preemption is modelled); with prefix caching, as in vLLM, the KV
blocks not reserved keep the prompt prefixes computed last (LRU, evicted as reservations need the blocks), so a cached
prefix is not recomputed.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque

from pdfleet.perfmodel.timing import Hardware, StepLoad, chunk_attention_pairs, step_time
from pdfleet.sim.observe import PoolStats

SPAN_CONTEXT_GROWTH = 0.05  # a span ends once the batch's context grew this much, so its step time stays accurate
MIN_SPAN_STEPS = 8


class SimSeq:
    """A request's stay on one engine: `prompt` tokens of which `cached` need no compute, then `output` tokens."""

    __slots__ = (
        "request",
        "arrival",
        "prompt",
        "cached",
        "output",
        "prefix",
        "computed",
        "end_mark",
        "first_token_at",
        "finished_at",
    )

    def __init__(
        self, request: object, arrival: float, prompt: int, output: int, cached: int = 0, prefix: tuple[int, ...] = ()
    ) -> None:
        self.request = request  # the simulator's record of the whole request
        self.arrival = arrival
        self.prompt = prompt
        self.cached = min(cached, prompt - 1)  # vLLM computes the last prompt token to sample the first new one
        self.output = output
        self.prefix = prefix  # chained prefix-block hashes (prefix caching)
        self.computed = self.cached
        self.end_mark = 0
        self.first_token_at: float | None = None
        self.finished_at: float | None = None


class SimEngine:
    """Scheduler state and timing of one instance; the simulator drives it with submit() and step_done()."""

    def __init__(
        self,
        name: str,
        pool: str,
        rack: str,
        zone: str,
        hw: Hardware,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        kv_capacity_tokens: int,
        prefix_caching: bool = False,
        prefix_block_tokens: int = 64,
        stats: PoolStats | None = None,
    ) -> None:
        self.name, self.pool, self.rack, self.zone = name, pool, rack, zone
        self.hw = hw
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.kv_capacity_tokens = kv_capacity_tokens
        self.prefix_cache: OrderedDict[int, None] = OrderedDict()
        self.prefix_caching = prefix_caching
        self.prefix_block_tokens = prefix_block_tokens
        self.stats = stats if stats is not None else PoolStats(pool)  # this engine's share of the pool metrics
        # router-facing state (router.policy.Candidate)
        self.healthy = True
        self.draining = False
        self.inflight = 0
        # scheduler state
        self.waiting: deque[SimSeq] = deque()
        self.prefilling: list[SimSeq] = []
        self.decoding: list[tuple[int, int, SimSeq]] = []  # heap of (end mark, tiebreak, seq)
        self.decode_steps = 0  # the shared counter: decode steps run so far
        self.context_base = 0  # sum over decoding seqs of (KV tokens - decode_steps at join)
        self.kv_reserved = 0
        self.prefix_blocks_held = 0  # prefix blocks of admitted sequences: cached and in use, never evicted
        self.pulling = 0  # requests whose KV is in flight to this engine (counted as waiting)
        self._tiebreak = 0
        # the step or span in progress
        self.busy = False
        self.version = 0
        self._start = 0.0
        self._dt = 0.0
        self._steps = 0
        self._prefill_plan: list[tuple[SimSeq, int]] = []

    # -- views -------------------------------------------------------------------------------------------------
    @property
    def running(self) -> int:
        """Sequences admitted to the batch (vllm:num_requests_running)."""
        return len(self.prefilling) + len(self.decoding)

    @property
    def queued(self) -> int:
        """Sequences waiting for admission, including KV pulls in flight (vllm:num_requests_waiting)."""
        return len(self.waiting) + self.pulling

    @property
    def kv_usage(self) -> float:
        """Reserved KV as a fraction of capacity."""
        return min(1.0, self.kv_reserved / self.kv_capacity_tokens) if self.kv_capacity_tokens else 0.0

    @property
    def idle(self) -> bool:
        """Nothing queued, running or arriving."""
        return not self.busy and not self.waiting and not self.running and not self.pulling

    def cached_prefix_tokens(self, prefix: tuple[int, ...]) -> int:
        """Tokens of `prefix` (chained block hashes) whose KV this engine still caches."""
        hits = 0
        for h in prefix:
            if h not in self.prefix_cache:
                break
            hits += 1
        return hits * self.prefix_block_tokens

    # -- driving -----------------------------------------------------------------------------------------------
    def submit(self, seq: SimSeq, now: float) -> float | None:
        """Queue a sequence; returns the new end time of the step in progress (or of a new one), None if unchanged."""
        if seq.prefix and self.prefix_caching:
            seq.cached = max(seq.cached, min(self.cached_prefix_tokens(seq.prefix), seq.prompt - 1))
            seq.computed = seq.cached
        self.waiting.append(seq)
        if not self.busy:
            return self._plan(now)
        if self._prefill_plan or self._steps <= 1 or len(self.waiting) > 1:
            return None  # a single step, or earlier arrivals already wait: the newcomer joins the next plan
        done = min(self._steps - 1, int((now - self._start) / self._dt))
        self._steps = done + 1  # finish the step in progress, then re-plan with the newcomer
        self.version += 1
        return self._start + self._steps * self._dt

    def step_done(self, now: float) -> tuple[list[SimSeq], list[SimSeq], float | None]:
        """Apply the step or span that ends now: (seqs that got their first token, seqs finished, next end time)."""
        self.busy = False
        first: list[SimSeq] = []
        finished: list[SimSeq] = []
        n = len(self.decoding)
        if n:
            self.decode_steps += self._steps
            self.stats.record_decode(now, self._dt, n * self._steps)
            while self.decoding and self.decoding[0][0] <= self.decode_steps:
                _, _, seq = heapq.heappop(self.decoding)
                self.context_base -= seq.prompt - (seq.end_mark - seq.output + 1)  # undo its _join term
                self._finish(seq, now, finished)
        for seq, tokens in self._prefill_plan:
            seq.computed += tokens
            if seq.computed >= seq.prompt:
                self.prefilling.remove(seq)
                self._remember_prefix(seq.prefix)
                seq.first_token_at = now
                self.stats.record_first_token(now, now - seq.arrival, seq.prompt, seq.prompt - seq.cached)
                first.append(seq)
                if seq.output <= 1:
                    self._finish(seq, now, finished)
                else:
                    self._join(seq)
        self._prefill_plan = []
        return first, finished, self._plan(now)

    # -- internals ---------------------------------------------------------------------------------------------
    def _join(self, seq: SimSeq) -> None:
        """Enter the decode batch with KV = prompt tokens; it finishes after output - 1 more steps."""
        seq.end_mark = self.decode_steps + seq.output - 1
        self.context_base += seq.prompt - self.decode_steps
        self._tiebreak += 1
        heapq.heappush(self.decoding, (seq.end_mark, self._tiebreak, seq))

    def _finish(self, seq: SimSeq, now: float, finished: list[SimSeq]) -> None:
        seq.finished_at = now
        self.kv_reserved -= seq.prompt + seq.output
        self.prefix_blocks_held -= len(seq.prefix)
        self.stats.record_finished()
        finished.append(seq)

    def _remember_prefix(self, prefix: tuple[int, ...]) -> None:
        if not self.prefix_caching:
            return
        cache = self.prefix_cache
        for h in prefix:
            cache[h] = None
            cache.move_to_end(h)
        self._evict_prefixes()

    def _evict_prefixes(self) -> None:
        """Keep no more cached prefix blocks than the free KV blocks plus those running sequences use (LRU first)."""
        free_blocks = max(0, self.kv_capacity_tokens - self.kv_reserved) // self.prefix_block_tokens
        cache = self.prefix_cache
        while len(cache) > free_blocks + self.prefix_blocks_held:
            cache.popitem(last=False)

    def _admit(self) -> None:
        while self.waiting and self.running < self.max_num_seqs:
            seq = self.waiting[0]
            need = seq.prompt + seq.output
            if self.kv_reserved + need > self.kv_capacity_tokens and self.running:
                return  # wait for KV to free up (an empty engine admits anything, as vLLM caps by max_model_len)
            self.waiting.popleft()
            self.kv_reserved += need
            self.prefix_blocks_held += len(seq.prefix)
            self.prefilling.append(seq)
        if self.prefix_cache:
            self._evict_prefixes()

    def _plan(self, now: float) -> float | None:
        """Start the next step or span at `now`; returns its end time, or None when there is nothing to run."""
        self._admit()
        n = len(self.decoding)
        context = self.context_base + n * self.decode_steps  # KV tokens of the decode batch
        budget = self.max_num_batched_tokens - n
        plan: list[tuple[SimSeq, int]] = []
        prefill_tokens = pairs = 0
        for seq in self.prefilling:
            if budget <= 0:
                break
            chunk = min(budget, seq.prompt - seq.computed)
            plan.append((seq, chunk))
            prefill_tokens += chunk
            pairs += chunk_attention_pairs(seq.computed, chunk)
            budget -= chunk
        if plan:
            steps = 1
            load = StepLoad(prefill_tokens, pairs, n, context + n)
        elif n:
            to_finish = self.decoding[0][0] - self.decode_steps
            growth_cap = max(MIN_SPAN_STEPS, int(SPAN_CONTEXT_GROWTH * context / n))
            steps = max(1, min(to_finish, growth_cap))
            load = StepLoad(0, 0, n, int(context + n + n * (steps - 1) / 2))  # mid-span context
        else:
            return None
        self._prefill_plan = plan
        self._dt = step_time(self.hw, load)
        self._steps = steps
        self._start = now
        self.busy = True
        self.version += 1
        return now + self._dt * steps
