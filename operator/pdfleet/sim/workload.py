"""Synthetic load profiles (steady, ramp, burst, diurnal) as pure functions of a seed, and the held-out trace suite.

Arrivals are a non-homogeneous Poisson process drawn by thinning against the profile's rate curve; prompt and output
lengths are log-normal around their medians, clipped to [min, max]. A profile may give a share of its requests one of
a few shared prompt prefixes (system prompts, few-shot headers), which the prefix cache can reuse. The simulator and
the load-replay command (issue 6) both build their synthetic traces here; `HELDOUT_SHAPES` are the workload shapes the
autoscaler's defaults were not tuned on (issue 13), judged by bench/heldout_bench.py.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from pdfleet.sim.profile import demand_series
from pdfleet.sim.trace import TraceRequest

PROFILE_KINDS = ("steady", "ramp", "burst", "diurnal")


@dataclass(frozen=True)
class LoadProfile:
    """A request-rate curve over `duration_s` and the token-length distributions.

    steady: base_rps throughout. ramp: base_rps to peak_rps linearly. burst: base_rps with peak_rps for burst_s every
    period_s (first burst at period_s / 2). diurnal: a cosine between base_rps (t=0) and peak_rps (t=period_s/2).
    """

    kind: str = "steady"
    duration_s: float = 600.0
    base_rps: float = 2.0
    peak_rps: float = 8.0
    period_s: float = 300.0
    burst_s: float = 60.0
    prompt_median: int = 1000
    prompt_sigma: float = 0.8
    prompt_max: int = 8192
    prompt_min: int = 1
    output_median: int = 128
    output_sigma: float = 0.8
    output_max: int = 1024
    prefix_groups: int = 0
    prefix_share: float = 0.0
    prefix_tokens: int = 0
    block_tokens: int = 64

    def __post_init__(self) -> None:
        if self.kind not in PROFILE_KINDS:
            raise ValueError(f"unknown profile {self.kind!r}; expected one of {', '.join(PROFILE_KINDS)}")
        if not 1 <= self.prompt_min <= self.prompt_max:
            raise ValueError(f"prompt_min {self.prompt_min} must be in [1, prompt_max {self.prompt_max}]")
        if self.prefix_groups and (not 0.0 < self.prefix_share <= 1.0 or self.prefix_tokens < self.block_tokens):
            raise ValueError("shared prefixes need prefix_share in (0, 1] and prefix_tokens >= block_tokens")


def rate_at(profile: LoadProfile, t: float) -> float:
    """Requests per second the profile asks for at time t."""
    base, peak = profile.base_rps, profile.peak_rps
    if profile.kind == "steady":
        return base
    if profile.kind == "ramp":
        return base + (peak - base) * min(1.0, max(0.0, t / profile.duration_s))
    if profile.kind == "burst":
        phase = (t - profile.period_s / 2) % profile.period_s
        return peak if t >= profile.period_s / 2 and phase < profile.burst_s else base
    return base + (peak - base) * (1 - math.cos(2 * math.pi * t / profile.period_s)) / 2


def max_rate(profile: LoadProfile) -> float:
    """Upper bound of rate_at over the profile (the thinning envelope)."""
    return profile.base_rps if profile.kind == "steady" else max(profile.base_rps, profile.peak_rps)


def _length(rng: random.Random, median: int, sigma: float, cap: int, low: int = 1) -> int:
    return min(cap, max(low, int(round(rng.lognormvariate(math.log(median), sigma)))))


def _with_shared_prefix(profile: LoadProfile, rng: random.Random, request: TraceRequest) -> TraceRequest:
    """The request with one group's shared prefix in front of its prompt, for a prefix_share of requests."""
    if rng.random() >= profile.prefix_share:
        return request
    group = rng.randrange(profile.prefix_groups)
    blocks = profile.prefix_tokens // profile.block_tokens
    return TraceRequest(
        arrival=request.arrival,
        prompt_tokens=blocks * profile.block_tokens + request.prompt_tokens,
        output_tokens=request.output_tokens,
        prefix_blocks=tuple(group * 1_000_000 + k for k in range(blocks)),
    )


def generate(profile: LoadProfile, seed: int = 0) -> list[TraceRequest]:
    """Draw one trace from the profile; the same seed gives the same trace."""
    rng = random.Random(seed)
    envelope = max_rate(profile)
    if envelope <= 0:
        return []
    requests: list[TraceRequest] = []
    t = 0.0
    while True:
        t += rng.expovariate(envelope)
        if t >= profile.duration_s:
            return requests
        if rng.random() * envelope <= rate_at(profile, t):
            request = TraceRequest(
                arrival=t,
                prompt_tokens=_length(
                    rng, profile.prompt_median, profile.prompt_sigma, profile.prompt_max, profile.prompt_min
                ),
                output_tokens=_length(rng, profile.output_median, profile.output_sigma, profile.output_max),
            )
            requests.append(_with_shared_prefix(profile, rng, request) if profile.prefix_groups else request)


def peak_to_mean(trace: list[TraceRequest]) -> float:
    """Busiest minute's request rate over the trace's mean rate (per-minute, like the public traces' figures)."""
    rates = [rps for rps, _, _ in demand_series(trace)]
    mean = sum(rates) / len(rates) if rates else 0.0
    return max(rates) / mean if mean else 0.0


def prefix_reuse_ratio(trace: list[TraceRequest], block_tokens: int = 64) -> float:
    """Share of all prompt tokens in prefix blocks an earlier request already sent: an unbounded cache's hit ratio."""
    seen: set[int] = set()
    reused = 0
    for r in trace:
        reused += sum(block_tokens for b in r.prefix_blocks if b in seen)
        seen.update(r.prefix_blocks)
    total = sum(r.prompt_tokens for r in trace)
    return reused / total if total else 0.0


def heldout_shapes(duration_s: float = 1200.0) -> dict[str, LoadProfile]:
    """Workload shapes the autoscaler's defaults were not tuned on (issue 13), each `duration_s` long.

    long-prompt: 10k-100k-token prompts at a steady rate (low peak-to-mean); prefix-reuse: 80 % of requests open with
    one of 8 shared 4k-token prefixes (reuse ratio ~0.7); bursty: 6x bursts of 90 s every 5 min (coarse bursts, high
    peak-to-mean); diurnal: one cosine day from 0.4 to 4 rps; decode-heavy: short prompts, long outputs.
    """
    return {
        "long-prompt": LoadProfile(
            "steady",
            duration_s,
            base_rps=0.2,
            prompt_median=24000,
            prompt_sigma=0.6,
            prompt_min=10000,
            prompt_max=100000,
            output_median=200,
        ),
        "prefix-reuse": LoadProfile(
            "steady",
            duration_s,
            base_rps=1.5,
            prompt_median=600,
            output_median=150,
            prefix_groups=8,
            prefix_share=0.8,
            prefix_tokens=4096,
        ),
        "bursty": LoadProfile(
            "burst", duration_s, base_rps=0.8, peak_rps=5.0, period_s=300.0, burst_s=90.0, prompt_median=1500
        ),
        "diurnal": LoadProfile(
            "diurnal", duration_s, base_rps=0.4, peak_rps=4.0, period_s=duration_s, prompt_median=2000, prompt_sigma=1.0
        ),
        "decode-heavy": LoadProfile(
            "steady",
            duration_s,
            base_rps=1.5,
            prompt_median=400,
            output_median=700,
            output_sigma=0.5,
            output_max=4096,
        ),
    }


def parse_profile(text: str) -> LoadProfile:
    """A profile from 'kind[:key=value,...]', e.g. 'burst:base_rps=2,peak_rps=10,duration_s=900'."""
    kind, _, rest = text.partition(":")
    fields: dict[str, float | int] = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        default = getattr(LoadProfile, key.strip(), None)
        if default is None or key.strip() == "kind":
            raise ValueError(f"unknown profile field {key!r}")
        fields[key.strip()] = type(default)(float(value))
    return LoadProfile(kind=kind.strip(), **fields)
