"""Pure parts of the load replay: prompts, request bodies, stream parsing, statistics, trace windows, CLI traces."""

from __future__ import annotations

import pytest

from pdfleet.loadgen.replay import (
    RequestResult,
    Sla,
    _parser,
    _Stream,
    arrivals_per_second,
    completion_body,
    format_summary,
    is_loopback,
    meets_sla,
    percentile,
    prompt_token_ids,
    summarize,
    trace_from_args,
    window_trace,
)
from pdfleet.sim.trace import TraceRequest


def test_prompts_have_the_trace_length_and_share_exactly_their_prefix_blocks():
    a = prompt_token_ids(TraceRequest(0.0, 300, 8, (7, 8)), index=0, block_tokens=64)
    b = prompt_token_ids(TraceRequest(0.0, 200, 8, (7, 8)), index=1, block_tokens=64)
    c = prompt_token_ids(TraceRequest(0.0, 300, 8, ()), index=2, block_tokens=64)
    assert (len(a), len(b), len(c)) == (300, 200, 300)
    assert a[:128] == b[:128] and a[128:200] != b[128:200]
    assert c[:64] != a[:64]
    assert all(0 < t < 32000 for t in a + b + c)
    assert prompt_token_ids(TraceRequest(0.0, 10, 1, (1, 2)), 0, 64) == prompt_token_ids(
        TraceRequest(0, 10, 1, (1,)), 5, 64
    )


def test_completion_body_streams_exactly_the_output_length():
    body = completion_body("llama-8b", TraceRequest(0.0, 5, 12), 3, 64)
    assert body["model"] == "llama-8b" and body["stream"] is True and len(body["prompt"]) == 5
    assert body["max_tokens"] == body["min_tokens"] == 12 and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_stream_counts_tokens_and_needs_done():
    stream = _Stream(sent=10.0)
    stream.feed(b'data: {"choices":[{"text":"alpha "}]}\n', 10.2)
    stream.feed(b"\n", 10.25)
    stream.feed(b'data: {"choices":[{"text":"bravo ","finish_reason":"length"}]}\n', 10.3)
    assert (stream.tokens, stream.first, stream.last, stream.done) == (2, 10.2, 10.3, False)
    stream.feed(b"data: [DONE]\n", 10.4)
    assert stream.done
    with pytest.raises(RuntimeError, match="boom"):
        stream.feed(b'data: {"error": {"message": "boom"}}\n', 10.5)


def test_stream_counts_tokens_by_the_engines_usage_when_chunks_pack_several():
    stream = _Stream(sent=10.0)
    stream.feed(b'data: {"choices":[{"text":"alpha bravo charlie"}]}\n', 10.2)  # a lagging engine packs three
    stream.feed(b'data: {"choices":[{"text":""}]}\n', 10.3)  # a token that decodes to no text yet
    stream.feed(b'data: {"choices":[{"text":" delta","finish_reason":"length"}]}\n', 10.4)
    assert stream.tokens == 2  # without usage: the chunks with text
    stream.feed(b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":5,"total_tokens":10}}\n', 10.5)
    stream.feed(b"data: [DONE]\n", 10.5)
    assert (stream.tokens, stream.done) == (5, True)


def test_percentile_interpolates_between_ranks():
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile(list(range(101)), 90) == 90


def _result(index: int, ttft: float | None = 0.2, tpot: float | None = 0.05, error: str | None = None) -> RequestResult:
    return RequestResult(
        index,
        float(index),
        100,
        10,
        tokens_received=0 if error else 10,
        ttft_s=ttft,
        tpot_s=tpot,
        latency_s=None if error else 1.0,
        error=error,
    )


def test_sla_is_met_per_objective_and_failed_requests_meet_none():
    sla = Sla(ttft_ms=500, tpot_ms=50)
    assert meets_sla(_result(0), sla) == (True, True)
    assert meets_sla(_result(0, ttft=0.6, tpot=0.06), sla) == (False, False)
    assert meets_sla(_result(0, tpot=None), sla) == (True, True)
    assert meets_sla(_result(0, error="http 500: x"), sla) == (False, False)


def test_summary_counts_errors_percentiles_and_attainment_over_all_requests():
    results = [_result(0), _result(1, ttft=0.9), _result(2, error="http 503: busy"), _result(3, error="timeout: x")]
    summary = summarize(results, Sla(500, 50), duration_s=2.0)
    assert (summary["requests"], summary["completed"], summary["errors"]) == (4, 2, 2)
    assert summary["error_kinds"] == {"http 503": 1, "timeout": 1}
    assert summary["ttft_ms"] == {"p50": 550.0, "p90": 830.0, "p99": 893.0}
    assert summary["sla_attainment"] == {"ttft": 0.25, "tpot": 0.5, "both": 0.25}
    assert summary["throughput_rps"] == 1.0 and summary["output_tokens_per_s"] == 10.0
    assert "errors 2" in format_summary(summary) and "SLA attainment (both): 25.0%" in format_summary(summary)


def test_trace_window_speeds_up_and_cuts_by_time_and_count():
    trace = [TraceRequest(t, 10, 1) for t in (0.0, 2.0, 4.0, 6.0, 8.0)]
    assert [r.arrival for r in window_trace(trace, speed=2.0, duration_s=3.0, max_requests=10)] == [0.0, 1.0, 2.0]
    assert len(window_trace(trace, speed=1.0, duration_s=None, max_requests=2)) == 2


def test_arrivals_are_binned_per_second():
    trace = [TraceRequest(t, 10, 1) for t in (0.1, 0.9, 1.5, 3.2, 9.0)]
    assert arrivals_per_second(trace, 4) == [2, 1, 0, 1]


def test_only_loopback_urls_pass_by_default():
    assert is_loopback("http://127.1.0.5:8080") and is_loopback("http://localhost:80") and is_loopback("http://[::1]:1")
    assert not is_loopback("http://10.0.0.1:8080")


def test_command_line_synthetic_profiles_and_missing_trace_fallback(tmp_path):
    args = _parser().parse_args(
        [
            "--url",
            "http://127.0.0.1:1",
            "--profile",
            "burst",
            "--duration",
            "30",
            "--rate",
            "1",
            "--peak-rate",
            "5",
            "--burst-seconds",
            "10",
            "--seed",
            "3",
        ]
    )
    description, requests = trace_from_args(args)
    assert description == "synthetic burst" and requests and all(r.arrival < 30 for r in requests)
    in_burst = sum(1 for r in requests if 15 <= r.arrival < 25)
    assert in_burst > sum(1 for r in requests if r.arrival < 10)
    missing = _parser().parse_args(
        ["--url", "http://127.0.0.1:1", "--profile", "trace", "--trace", str(tmp_path / "none.csv"), "--duration", "20"]
    )
    assert trace_from_args(missing)[0] == "synthetic diurnal"


def test_command_line_reads_an_azure_csv_trace(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:00.0000000,100,5\n2023-11-16 18:00:04.0000000,200,6\n"
        "2023-11-16 18:00:30.0000000,300,7\n"
    )
    args = _parser().parse_args(
        ["--url", "http://127.0.0.1:1", "--profile", "trace", "--trace", str(path), "--speed", "2", "--duration", "10"]
    )
    description, requests = trace_from_args(args)
    assert description == "trace azure.csv x2"
    assert [(r.arrival, r.prompt_tokens, r.output_tokens) for r in requests] == [(0.0, 100, 5), (2.0, 200, 6)]
