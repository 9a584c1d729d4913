"""What `pdfleet demo` shows a person: its load phases, live view, summary and plot, on a synthetic timeline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pdfleet.loadgen.replay import RequestResult, summarize
from pdfleet.localfleet.demo import (
    BASE_TAIL_FRACTION,
    SLA,
    Sample,
    demo_pdd,
    demo_trace,
    max_replicas,
    moving_average,
    plain_line,
    real_vllm_pdd,
    render_view,
    scaling_steps,
    summary_text,
    watch_lines,
    write_plot,
)

BOUNDS = {"prefill": 4, "decode": 3}


def _sample(t: float, prefill: int, decode: int, rps: int = 2) -> Sample:
    return Sample(
        t=t,
        sent_rps=rps,
        completed=int(t) * 2,
        errors=0,
        ready={"prefill": {"rack-a": prefill - prefill // 2, "rack-b": prefill // 2}, "decode": {"rack-a": decode}},
        desired={"prefill": prefill, "decode": decode},
        ttft_p90_ms=400.0 + 10 * t,
        tpot_p90_ms=None if t < 2 else 60.0,
    )


# prefill 1 -> 2 -> 4 -> 3 -> 1, decode 1 -> 2 -> 1
TIMELINE = [
    _sample(t, p, d, rps)
    for t, p, d, rps in [
        (0, 1, 1, 1),
        (1, 1, 1, 2),
        (2, 2, 1, 5),
        (3, 4, 2, 8),
        (4, 4, 2, 7),
        (5, 3, 2, 3),
        (6, 1, 1, 1),
        (7, 1, 1, 1),
    ]
]


def _replay_summary() -> dict:
    results = [
        RequestResult(i, i * 0.1, 600, 32, tokens_received=32, ttft_s=0.3 + i / 100, tpot_s=0.05, latency_s=2.0)
        for i in range(40)
    ]
    results += [
        RequestResult(40, 4.0, 600, 32, error="timeout: no reply"),
        RequestResult(41, 4.1, 600, 32, error="http"),
    ]
    return summarize(results, SLA, 8.0)


def test_scaling_steps_are_every_change_of_desired_replicas() -> None:
    assert scaling_steps(TIMELINE) == [
        (2, "prefill", 1, 2),
        (3, "prefill", 2, 4),
        (3, "decode", 1, 2),
        (5, "prefill", 4, 3),
        (6, "prefill", 3, 1),
        (6, "decode", 2, 1),
    ]


def test_moving_average_is_centred_over_its_window_and_keeps_the_length() -> None:
    assert moving_average([0, 10, 20, 30, 40], 3) == [5, 10, 20, 30, 35]
    assert moving_average([0, 0, 9, 0, 0], 5) == [3, 2.25, 1.8, 2.25, 3]
    assert moving_average([], 10) == []


def test_the_summary_is_aligned_text_without_raw_data_structures() -> None:
    events = [
        "12:00:01 ScaledUp: prefill 1\u21922: TTFT p90 1400 ms > 1000 ms",
        "12:00:40 ScaledDown: prefill 4\u21923",
    ]
    text = summary_text(TIMELINE, _replay_summary(), events, 21.4, BOUNDS)
    assert not re.search(r"[{}\[\]]", text), text
    assert "errors         2 (http 1, timeout 1)" in text
    lines = text.splitlines()
    latency_header = next(line for line in lines if "p50" in line)
    ttft_row = next(line for line in lines if line.strip().startswith("TTFT"))
    for column in ("p50", "p90", "p99", "SLA", "attained"):  # right-aligned under their headers
        end = latency_header.index(column) + len(column)
        assert ttft_row[end - 1] != " " and (end == len(ttft_row) or ttft_row[end] == " ")
    replicas_header = next(line for line in lines if "peak" in line)
    prefill = next(line for line in lines if line.strip().startswith("prefill"))
    assert replicas_header.split() == ["start", "peak", "final", "max", "final", "rack-a", "final", "rack-b"]
    assert prefill.split() == ["prefill", "1", "4", "1", "4", "1", "0"]
    assert "scaling events (2):" in text and events[1] in text


def test_the_live_view_and_plain_line_show_each_pools_max_and_where_to_watch() -> None:
    header = watch_lines(Path("/tmp/fleet/admin.kubeconfig"), "http://127.0.0.1:9090")
    assert any(line.endswith("--kubeconfig /tmp/fleet/admin.kubeconfig get pdd -w") for line in header)
    assert any("http://127.0.0.1:9090" in line for line in header)
    screen = render_view(TIMELINE[3], 240, [], ["rack-a", "rack-b"], BOUNDS, header)
    assert screen.splitlines()[: len(header)] == header
    table = screen.splitlines()[len(header) + 3 :][:3]
    assert table[0].split()[:4] == ["pool", "ready", "desired", "max"]
    assert table[1].split()[:4] == ["prefill", "4", "4", "4"] and table[2].split()[:4] == ["decode", "2", "2", "3"]
    line = plain_line(TIMELINE[3], BOUNDS)
    assert "prefill 4/4 (max 4)" in line and "decode 2/2 (max 3)" in line
    assert not re.search(r"[{}]", line)


def test_max_replicas_is_the_autoscaling_bound_or_the_fixed_count() -> None:
    assert max_replicas(demo_pdd("http://p", max_replicas=5)) == {"prefill": 5, "decode": 5}
    assert max_replicas(real_vllm_pdd("http://p")) == {"prefill": 1, "decode": 1}


def test_the_load_falls_back_to_base_early_enough_for_a_scale_down() -> None:
    duration, base, peak = 240.0, 1.0, 8.0
    trace = demo_trace(duration, base, peak, seed=3)
    assert all(0 <= r.arrival < duration for r in trace)
    assert [r.arrival for r in trace] == sorted(r.arrival for r in trace)
    tail_start = duration * (1 - BASE_TAIL_FRACTION)
    tail = [r for r in trace if r.arrival >= tail_start]
    peak_window = [r for r in trace if 0.2 * duration <= r.arrival < 0.4 * duration]
    assert len(tail) / (duration - tail_start) == pytest.approx(base, rel=0.35)
    assert len(peak_window) / (0.2 * duration) > 0.7 * peak
    assert duration - tail_start >= 90  # > scale-down stabilization (30 s) + three one-step drains


def test_the_plot_is_written_with_a_synthetic_timeline(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "demo.png"
    write_plot(TIMELINE, path, BOUNDS)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
