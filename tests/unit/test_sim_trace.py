"""Trace readers, load scaling, synthetic prefixes and the synthetic load profiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.sim.trace import (
    TraceRequest,
    add_shared_prefixes,
    read_trace,
    scale_load,
    trace_stats,
    write_jsonl,
)
from pdfleet.sim.workload import LoadProfile, generate, parse_profile, rate_at

SHARED_CONV = (
    Path(__file__).resolve().parents[2] / ".." / "shared" / "traces" / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
)


def test_reads_azure_columns_and_normalizes_time(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
    )
    trace = read_trace(path)
    assert [(r.prompt_tokens, r.output_tokens) for r in trace] == [(374, 44), (396, 109)]
    assert trace[0].arrival == 0.0
    assert trace[1].arrival == pytest.approx(4.314579, abs=1e-6)


def test_jsonl_round_trip_keeps_prefix_blocks(tmp_path: Path) -> None:
    trace = [TraceRequest(0.0, 100, 5, (1, 2)), TraceRequest(1.5, 20, 7)]
    write_jsonl(trace, tmp_path / "t.jsonl")
    assert read_trace(tmp_path / "t.jsonl") == trace


def test_generic_csv_with_prefix_ids(tmp_path: Path) -> None:
    path = tmp_path / "g.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens,prefix_blocks\n3,10,2,7 8\n1,20,3,\n")
    assert read_trace(path) == [TraceRequest(0.0, 20, 3), TraceRequest(2.0, 10, 2, (7, 8))]


def test_missing_column_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("when,prompt_tokens\n1,2\n")
    with pytest.raises(ValueError, match="arrival"):
        read_trace(path)


def test_scale_load_multiplies_rate_within_the_span() -> None:
    trace = generate(LoadProfile("steady", duration_s=300, base_rps=2.0), seed=3)
    scaled = scale_load(trace, 4, seed=1)
    assert len(scaled) == 4 * len(trace)
    assert all(a.arrival <= b.arrival for a, b in zip(scaled, scaled[1:]))
    assert scaled[-1].arrival <= trace[-1].arrival + 1e-6


def test_shared_prefixes_only_on_longer_prompts() -> None:
    trace = [TraceRequest(float(i), 100 if i % 2 else 5000, 10) for i in range(200)]
    out = add_shared_prefixes(trace, groups=3, prefix_tokens=1024, share=1.0, block_tokens=64, seed=0)
    assert all(not r.prefix_blocks for r in out[1::2])
    assert all(len(r.prefix_blocks) == 16 for r in out[0::2])
    assert len({r.prefix_blocks for r in out[0::2]}) <= 3


@pytest.mark.skipif(not SHARED_CONV.exists(), reason="shared traces not present")
def test_reads_the_shared_conv_trace_head() -> None:
    trace = read_trace(SHARED_CONV, limit=500)
    stats = trace_stats(trace)
    assert stats["requests"] == 500
    assert 2 < stats["rate_rps"] < 10


@pytest.mark.parametrize("kind", ["steady", "ramp", "burst", "diurnal"])
def test_profiles_are_deterministic_and_follow_their_rate(kind: str) -> None:
    profile = LoadProfile(kind, duration_s=600, base_rps=2.0, peak_rps=8.0, period_s=300, burst_s=60)
    first, second = generate(profile, seed=7), generate(profile, seed=7)
    assert first == second
    expected = sum(rate_at(profile, t + 0.5) for t in range(600))
    assert len(first) == pytest.approx(expected, rel=0.12)
    assert all(1 <= r.prompt_tokens <= profile.prompt_max and 1 <= r.output_tokens <= profile.output_max for r in first)


def test_profile_shapes() -> None:
    burst = LoadProfile("burst", base_rps=1, peak_rps=9, period_s=100, burst_s=10)
    assert [rate_at(burst, t) for t in (0, 49, 50, 59, 60, 150)] == [1, 1, 9, 9, 1, 9]
    ramp = LoadProfile("ramp", duration_s=100, base_rps=0, peak_rps=10)
    assert rate_at(ramp, 50) == pytest.approx(5)
    diurnal = LoadProfile("diurnal", base_rps=2, peak_rps=6, period_s=100)
    assert rate_at(diurnal, 0) == pytest.approx(2) and rate_at(diurnal, 50) == pytest.approx(6)


def test_parse_profile() -> None:
    profile = parse_profile("burst:base_rps=2,peak_rps=10,duration_s=900,prompt_median=512")
    assert (profile.kind, profile.base_rps, profile.peak_rps, profile.duration_s, profile.prompt_median) == (
        "burst",
        2.0,
        10.0,
        900.0,
        512,
    )
    with pytest.raises(ValueError):
        parse_profile("steady:nope=1")
    with pytest.raises(ValueError):
        parse_profile("sawtooth")


def test_mooncake_jsonl_timestamps_are_milliseconds_and_blocks_512_tokens(tmp_path: Path) -> None:
    path = tmp_path / "mooncake.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 1100, "output_length": 9, "hash_ids": [0, 1]}\n'
        '{"timestamp": 3600000, "input_length": 600, "output_length": 4, "hash_ids": [0]}\n'
    )
    trace = read_trace(path, block_tokens=256)
    assert [r.arrival for r in trace] == [0.0, 3600.0]  # an hour, not 41 days
    assert trace[0].prefix_blocks == (0, 1, 2, 3)  # each 512-token id is two 256-token router blocks
    assert trace[1].prefix_blocks == (0, 1)


def test_numeric_arrival_of_unknown_unit_is_refused_unless_given(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("timestamp,prompt_tokens,output_tokens\n1000,10,2\n3000,10,2\n")
    with pytest.raises(ValueError, match="time-unit"):
        read_trace(path)
    assert [r.arrival for r in read_trace(path, time_unit="ms")] == [0.0, 2.0]
    assert [r.arrival for r in read_trace(path, time_unit="s")] == [0.0, 2000.0]


def test_a_span_of_weeks_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,2\n3600000,10,2\n")
    with pytest.raises(ValueError, match="days"):
        read_trace(path)


def test_scaled_copies_never_share_prefix_blocks() -> None:
    trace = [TraceRequest(float(i), 2000, 10, (7, 8)) for i in range(10)]
    scaled = scale_load(trace, 3, seed=0)
    copies = {r.prefix_blocks for r in scaled}
    assert len(copies) == 3  # within a copy the shared prefix stays shared
    firsts = [c[0] for c in copies]
    assert len(set(firsts)) == 3  # across copies not even the first block collides
