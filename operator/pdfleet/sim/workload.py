"""Synthetic load profiles (steady, ramp, burst, diurnal) as pure functions of a seed.

Arrivals are a non-homogeneous Poisson process drawn by thinning against the profile's rate curve; prompt and output
lengths are log-normal around their medians, clipped to [1, max]. The simulator and the load-replay command (issue 6)
both build their synthetic traces here.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

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
    output_median: int = 128
    output_sigma: float = 0.8
    output_max: int = 1024

    def __post_init__(self) -> None:
        if self.kind not in PROFILE_KINDS:
            raise ValueError(f"unknown profile {self.kind!r}; expected one of {', '.join(PROFILE_KINDS)}")


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


def _length(rng: random.Random, median: int, sigma: float, cap: int) -> int:
    return min(cap, max(1, int(round(rng.lognormvariate(math.log(median), sigma)))))


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
            requests.append(
                TraceRequest(
                    arrival=t,
                    prompt_tokens=_length(rng, profile.prompt_median, profile.prompt_sigma, profile.prompt_max),
                    output_tokens=_length(rng, profile.output_median, profile.output_sigma, profile.output_max),
                )
            )


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
