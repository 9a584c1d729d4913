"""The held-out trace suite (issue 13): each shape has the properties it is named for, and is deterministic."""

from __future__ import annotations

import pytest

from pdfleet.sim.config import FleetConfig
from pdfleet.sim.profile import prefill_ttft, unattainable_requests
from pdfleet.sim.trace import TraceRequest, scale_load
from pdfleet.sim.workload import LoadProfile, generate, heldout_shapes, peak_to_mean, prefix_reuse_ratio

SHAPES = heldout_shapes(1200.0)


def trace(name: str, seed: int = 13) -> list[TraceRequest]:
    return generate(SHAPES[name], seed)


def test_the_suite_has_five_shapes_and_each_is_seeded() -> None:
    assert set(SHAPES) == {"long-prompt", "prefix-reuse", "bursty", "diurnal", "decode-heavy"}
    for name in SHAPES:
        assert trace(name) == trace(name)
        assert trace(name) != trace(name, seed=14)


def test_long_prompts_are_10k_to_100k_tokens() -> None:
    prompts = [r.prompt_tokens for r in trace("long-prompt")]
    assert min(prompts) >= 10_000 and max(prompts) <= 100_000
    assert sum(p > 40_000 for p in prompts) > len(prompts) / 10  # a real tail, not a wall at the minimum


def test_prefix_reuse_ratio_is_what_the_profile_asks_and_survives_load_scaling() -> None:
    requests = trace("prefix-reuse")
    groups = {r.prefix_blocks[0] // 1_000_000 for r in requests if r.prefix_blocks}
    assert groups == set(range(8))
    assert sum(1 for r in requests if r.prefix_blocks) / len(requests) == pytest.approx(0.8, abs=0.03)
    assert prefix_reuse_ratio(requests) == pytest.approx(0.8, abs=0.05)
    assert prefix_reuse_ratio(scale_load(requests, 8, seed=13)) == pytest.approx(0.8, abs=0.05)
    assert prefix_reuse_ratio(trace("bursty")) == 0.0


def test_peak_to_mean_is_high_for_bursts_and_low_for_steady_shapes() -> None:
    assert peak_to_mean(trace("bursty")) > 2.2
    assert 1.4 < peak_to_mean(trace("diurnal")) < 2.2
    for steady in ("prefix-reuse", "decode-heavy"):
        assert peak_to_mean(trace(steady)) < 1.4


def test_decode_heavy_generates_more_tokens_than_it_reads() -> None:
    requests = trace("decode-heavy")
    assert sum(r.output_tokens for r in requests) > 1.2 * sum(r.prompt_tokens for r in requests)


def test_a_profile_without_shared_prefixes_draws_the_same_trace_as_before() -> None:
    # the new fields at their defaults take no random draws, so existing seeds keep their traces
    plain = generate(LoadProfile("steady", duration_s=120, base_rps=2.0), seed=5)
    assert all(not r.prefix_blocks for r in plain)
    assert plain == generate(LoadProfile("steady", duration_s=120, base_rps=2.0, prompt_min=1), seed=5)


def test_unattainable_requests_are_those_whose_own_prefill_exceeds_the_ttft_target() -> None:
    fleet = FleetConfig()
    short, long = TraceRequest(0.0, 500, 10), TraceRequest(1.0, 20_000, 10)
    assert prefill_ttft(fleet, 20_000) * 1000 > fleet.ttft_ms > prefill_ttft(fleet, 500) * 1000
    assert unattainable_requests(fleet, [short, long]) == [long]


def test_bad_shared_prefix_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        LoadProfile(prefix_groups=4, prefix_share=0.0, prefix_tokens=1024)
    with pytest.raises(ValueError):
        LoadProfile(prompt_min=10_000, prompt_max=8192)
