"""The vLLM PD bench's estimate of a quantile from histogram buckets agrees with Prometheus' histogram_quantile."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_bench():
    spec = importlib.util.spec_from_file_location("vllm_pd_bench", REPO / "bench" / "vllm_pd_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


bench = _load_bench()

INF = math.inf
# vllm:nixl_xfer_time_seconds-like buckets: 4 transfers <= 5 ms, 4 more <= 10 ms, 2 more <= 25 ms
BUCKETS = ((0.005, 4.0), (0.01, 8.0), (0.025, 10.0), (INF, 10.0))


def test_quantiles_interpolate_inside_the_bucket_that_holds_the_rank() -> None:
    assert bench.bucket_quantile(BUCKETS, 0.2) == pytest.approx(0.0025)  # first bucket starts at 0
    assert bench.bucket_quantile(BUCKETS, 0.5) == pytest.approx(0.00625)
    assert bench.bucket_quantile(BUCKETS, 0.99) == pytest.approx(0.01 + 0.015 * 1.9 / 2)


def test_a_rank_in_the_inf_bucket_answers_the_highest_finite_bound_and_no_counts_answer_none() -> None:
    assert bench.bucket_quantile(((0.005, 1.0), (0.01, 1.0), (INF, 4.0)), 0.99) == 0.01
    assert bench.bucket_quantile(((0.005, 0.0), (INF, 0.0)), 0.5) is None


def test_a_scrape_difference_keeps_only_what_was_observed_in_between() -> None:
    before = bench.Histogram(((0.005, 1.0), (INF, 2.0)), 2.0, 0.02)
    after = bench.Histogram(((0.005, 4.0), (INF, 6.0)), 6.0, 0.05)
    assert after.minus(before) == bench.Histogram(((0.005, 3.0), (INF, 4.0)), 4.0, pytest.approx(0.03))
