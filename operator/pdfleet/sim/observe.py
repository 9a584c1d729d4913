"""What the simulated Prometheus sees: per-pool latency samples and token counters, read over a trailing window.

Engines report into their pool's PoolStats; `PoolStats.reading` turns a window of it into the same PoolSignals the
operator's autoscaler gets from PromQL (pdfleet.autoscale.signals), so the policy code runs unchanged.
"""

from __future__ import annotations

import bisect
from collections import deque

from pdfleet.autoscale.signals import PoolSignals, TokenHistogram

HISTORY_S = 600.0  # samples older than this are dropped (longest window any policy reads)


def weighted_quantile(samples: list[tuple[float, float]], q: float) -> float | None:
    """The q-quantile (0..1) of (value, weight) samples; None when empty."""
    total = sum(w for _, w in samples)
    if total <= 0:
        return None
    target = q * total
    acc = 0.0
    for value, weight in sorted(samples):
        acc += weight
        if acc >= target:
            return value
    return samples[-1][0]


class PoolStats:
    """Latency samples and cumulative counters of one pool, plus snapshots of the counters for windowed rates."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.ttft: deque[tuple[float, float]] = deque()  # (time, engine-side TTFT s)
        self.itl: deque[tuple[float, float, int]] = deque()  # (time, inter-token s, tokens)
        self.computed: deque[tuple[float, int]] = deque()  # (time, prompt tokens computed: cache hits excluded)
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.finished = 0
        self.decode_seq_seconds = 0.0  # integral of decode batch size over time
        self._snap_times: list[float] = [0.0]
        self._snaps: list[tuple[int, int, int, float]] = [(0, 0, 0, 0.0)]

    def record_first_token(self, now: float, ttft: float, prompt_tokens: int, computed_tokens: int) -> None:
        """A sequence got its first token on an engine of this pool, after computing `computed_tokens` of its
        prompt (the rest came from a prefix cache or a remote prefill)."""
        self.ttft.append((now, ttft))
        self.computed.append((now, computed_tokens))
        self.prompt_tokens += prompt_tokens
        self.generated_tokens += 1

    def record_decode(self, now: float, dt: float, tokens: int) -> None:
        """A step or span produced `tokens` decode tokens, each `dt` after the previous one of its sequence."""
        self.itl.append((now, dt, tokens))
        self.generated_tokens += tokens
        self.decode_seq_seconds += dt * tokens

    def record_finished(self) -> None:
        """A sequence finished on an engine of this pool."""
        self.finished += 1

    def snapshot(self, now: float) -> None:
        """Remember the counters at `now` (called on a fixed cadence) and drop samples past HISTORY_S."""
        self._snap_times.append(now)
        self._snaps.append((self.prompt_tokens, self.generated_tokens, self.finished, self.decode_seq_seconds))
        horizon = now - HISTORY_S
        while self.ttft and self.ttft[0][0] < horizon:
            self.ttft.popleft()
        while self.itl and self.itl[0][0] < horizon:
            self.itl.popleft()
        while self.computed and self.computed[0][0] < horizon:
            self.computed.popleft()

    def rates(self, now: float, window_s: float) -> tuple[float, float, float, float]:
        """(prompt tok/s, generated tok/s, finished req/s, mean decode batch) over the window ending now."""
        i = min(bisect.bisect_left(self._snap_times, now - window_s), len(self._snap_times) - 1)
        t0 = self._snap_times[i]
        p0, g0, f0, s0 = self._snaps[i]
        span = max(now - t0, 1e-9)
        return (
            (self.prompt_tokens - p0) / span,
            (self.generated_tokens - g0) / span,
            (self.finished - f0) / span,
            (self.decode_seq_seconds - s0) / span,
        )

    def ttft_quantile(self, now: float, window_s: float, q: float) -> float | None:
        """q-quantile of engine TTFT over the window."""
        return weighted_quantile([(v, 1.0) for t, v in self.ttft if t >= now - window_s], q)

    def itl_quantile(self, now: float, window_s: float, q: float) -> float | None:
        """q-quantile of inter-token latency (token-weighted) over the window."""
        return weighted_quantile([(dt, float(n)) for t, dt, n in self.itl if t >= now - window_s], q)

    def computed_prompts(self, now: float, window_s: float) -> tuple[TokenHistogram, float]:
        """Requests/s by prompt tokens computed over the window, as vLLM's vllm:request_prefill_kv_computed_tokens
        histogram reads through a rate (one bucket per distinct count: the simulator knows them exactly), and the
        computed tokens/s (the rate of its _sum)."""
        counts: dict[int, int] = {}
        for t, tokens in self.computed:
            if t >= now - window_s:
                counts[tokens] = counts.get(tokens, 0) + 1
        buckets, cumulative = [], 0
        for tokens in sorted(counts):
            cumulative += counts[tokens]
            buckets.append((float(tokens), cumulative / window_s))
        total = sum(tokens * count for tokens, count in counts.items())
        return TokenHistogram((*buckets, (float("inf"), cumulative / window_s))), total / window_s

    def reading(
        self,
        now: float,
        window_s: float,
        percentile: float,
        reporting: int,
        queue_total: float,
        running_total: float,
        kv_usage: float,
    ) -> PoolSignals:
        """The pool as the autoscaler's PromQL would read it at `now`."""
        prompt_tps, gen_tps, rate, _ = self.rates(now, window_s)
        prefill_tokens, computed_tps = self.computed_prompts(now, window_s)
        q = percentile / 100.0
        return PoolSignals(
            pool=self.pool,
            ttft_p=self.ttft_quantile(now, window_s, q),
            itl_p=self.itl_quantile(now, window_s, q),
            queue_total=queue_total,
            running_total=running_total,
            kv_usage=kv_usage,
            prompt_tps=prompt_tps,
            gen_tps=gen_tps,
            request_rate=rate,
            replicas_reporting=reporting,
            fetched_at=now,
            prefill_tokens=prefill_tokens,
            computed_tps=computed_tps,
        )
