"""The autoscaler's PromQL and Prometheus adapter against a real Prometheus scraping real exporters on 127.0.0.1.

Each fake engine is a prometheus_client HTTP server whose counters and histogram buckets grow linearly with time at
controlled rates, so rates and quantiles have exact expected values. The vLLM engines answer Prometheus's OpenMetrics
request (stored as `vllm_*`, prometheus/client_python#1177), the SGLang ones serve text format 0.0.4 (stored as
`sglang:*`), so the queries are checked against both spellings.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator
from wsgiref.simple_server import WSGIRequestHandler, make_server

import httpx
import pytest
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from pdfleet.autoscale import cli as autoscale_cli
from pdfleet.autoscale.promql import SGLANG_METRICS, VLLM_METRICS, EngineMetricNames, queries_per_interval
from pdfleet.autoscale.signals import (
    NO_SAMPLES,
    QUERY_ERROR,
    TIMEOUT,
    UNREACHABLE,
    MetricsUnavailable,
    PoolSignals,
    PrometheusSignalSource,
)
from pdfleet.localfleet.processes import free_port
from pdfleet.localfleet.prometheus import ScrapeTarget, prometheus_binary, start_prometheus

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.timeout(90),
    pytest.mark.skipif(prometheus_binary() is None, reason="prometheus binary not installed"),
]

WINDOW_S = 4
NAMESPACE = "inference"
TTFT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5)
ITL_BUCKETS = (0.01, 0.02, 0.05, 0.1)
PROMPT_BUCKETS = (1000.0, 5000.0, 10000.0)


@dataclass
class EngineLoad:
    """Controlled values one fake engine exports: gauges as-is, rates as linear growth per second."""

    names: EngineMetricNames
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    prompt_tps: float = 0.0
    gen_tps: float = 0.0
    request_rate: float = 0.0
    ttft_rates: dict[float, float] = field(default_factory=dict)  # bucket upper bound -> observations/s in it
    itl_rates: dict[float, float] = field(default_factory=dict)
    prefill_token_rates: dict[float, float] = field(default_factory=dict)  # computed prompt tokens -> requests/s


class LinearEngineCollector:
    """A prometheus_client collector whose counters are rate * seconds since start."""

    def __init__(self, load: EngineLoad) -> None:
        self.load = load
        self.started = time.time()

    def _histogram(self, name: str, bounds: tuple[float, ...], rates: dict[float, float], elapsed: float):
        family = HistogramMetricFamily(name, "fake", labels=["model_name"])
        cumulative, buckets = 0.0, []
        for bound in bounds:
            cumulative += rates.get(bound, 0.0) * elapsed
            buckets.append((repr(bound), cumulative))
        buckets.append(("+Inf", cumulative))
        # every observation at its bucket's upper bound
        family.add_metric(["fake-model"], buckets, sum_value=sum(b * r for b, r in rates.items()) * elapsed)
        return family

    def collect(self):
        """Yield every metric at its current linear value."""
        load, names, elapsed = self.load, self.load.names, time.time() - self.started
        for name, value in (
            (names.waiting_gauge, load.waiting),
            (names.running_gauge, load.running),
            (names.kv_usage_gauge, load.kv_usage),
        ):
            gauge = GaugeMetricFamily(name, "fake", labels=["model_name"])
            gauge.add_metric(["fake-model"], value)
            yield gauge
        for name, rate in (
            (names.prompt_tokens_counter, load.prompt_tps),
            (names.generation_tokens_counter, load.gen_tps),
        ):
            counter = CounterMetricFamily(name.removesuffix("_total"), "fake", labels=["model_name"])
            counter.add_metric(["fake-model"], rate * elapsed)
            yield counter
        yield self._histogram(names.ttft_histogram, TTFT_BUCKETS, load.ttft_rates, elapsed)
        yield self._histogram(names.itl_histogram, ITL_BUCKETS, load.itl_rates, elapsed)
        yield self._histogram(names.e2e_histogram, (1.0,), {1.0: load.request_rate}, elapsed)
        if names.prefill_tokens_histogram is not None:
            yield self._histogram(names.prefill_tokens_histogram, PROMPT_BUCKETS, load.prefill_token_rates, elapsed)


@dataclass
class FakeEngine:
    """A running fake engine: its scrape target and HTTP server."""

    target: ScrapeTarget
    server: object


def _labels(pdd: str, pool: str, pod: str, rack: str, namespace: str = NAMESPACE) -> dict[str, str]:
    return {"pdd": pdd, "pool": pool, "pod": pod, "rack": rack, "namespace": namespace}


# (target labels, load): two vLLM pools of "llama", an SGLang fleet "sgl", a prefill-only "half", and a decoy "llama"
# in another namespace with huge values that must never leak into the results.
FLEET = [
    (
        _labels("llama", "prefill", "llama-prefill-rack-a-0", "rack-a"),
        EngineLoad(
            VLLM_METRICS,
            waiting=3,
            running=2,
            kv_usage=0.2,
            prompt_tps=1000,
            gen_tps=10,
            request_rate=2,
            ttft_rates={0.5: 10.0},
            prefill_token_rates={1000.0: 2.0},
        ),
    ),
    (
        _labels("llama", "prefill", "llama-prefill-rack-b-0", "rack-b"),
        EngineLoad(
            VLLM_METRICS,
            waiting=5,
            running=4,
            kv_usage=0.4,
            prompt_tps=3000,
            gen_tps=10,
            request_rate=3,
            ttft_rates={1.0: 10.0},
            prefill_token_rates={1000.0: 1.0, 10000.0: 2.0},
        ),
    ),
    (
        _labels("llama", "decode", "llama-decode-rack-a-0", "rack-a"),
        EngineLoad(
            VLLM_METRICS, waiting=1, running=32, kv_usage=0.75, gen_tps=1500, request_rate=4, itl_rates={0.05: 100.0}
        ),
    ),
    (
        _labels("sgl", "prefill", "sgl-prefill-rack-a-0", "rack-a"),
        EngineLoad(
            SGLANG_METRICS, waiting=2, running=1, kv_usage=0.1, prompt_tps=500, request_rate=1, ttft_rates={0.25: 4.0}
        ),
    ),
    (
        _labels("sgl", "decode", "sgl-decode-rack-a-0", "rack-a"),
        EngineLoad(
            SGLANG_METRICS, waiting=0, running=8, kv_usage=0.5, gen_tps=400, request_rate=1, itl_rates={0.02: 50.0}
        ),
    ),
    (
        _labels("half", "prefill", "half-prefill-rack-a-0", "rack-a"),
        EngineLoad(VLLM_METRICS, waiting=1, running=1, prompt_tps=100, request_rate=1, ttft_rates={0.1: 1.0}),
    ),
    (
        _labels("llama", "prefill", "llama-prefill-rack-z-0", "rack-z", namespace="other"),
        EngineLoad(VLLM_METRICS, waiting=1000, running=1000, prompt_tps=1e6, request_rate=100, ttft_rates={2.5: 100.0}),
    ),
]

EXPECTED = {
    ("llama", "prefill"): dict(
        ttft_p=0.9,
        itl_p=None,
        queue_total=8,
        running_total=6,
        kv_usage=0.3,
        prompt_tps=4000,
        gen_tps=20,
        request_rate=5,
        replicas_reporting=2,
    ),
    ("llama", "decode"): dict(
        ttft_p=None,
        itl_p=0.047,
        queue_total=1,
        running_total=32,
        kv_usage=0.75,
        prompt_tps=0,
        gen_tps=1500,
        request_rate=4,
        replicas_reporting=1,
    ),
    ("sgl", "prefill"): dict(
        ttft_p=0.235,
        itl_p=None,
        queue_total=2,
        running_total=1,
        kv_usage=0.1,
        prompt_tps=500,
        gen_tps=0,
        request_rate=1,
        replicas_reporting=1,
    ),
    ("sgl", "decode"): dict(
        ttft_p=None,
        itl_p=0.019,
        queue_total=0,
        running_total=8,
        kv_usage=0.5,
        prompt_tps=0,
        gen_tps=400,
        request_rate=1,
        replicas_reporting=1,
    ),
}


def _matches(signals: PoolSignals, expected: dict) -> list[str]:
    """Differences between a reading and its expected values (3 % relative slack for rates and quantiles)."""
    wrong = []
    for name, want in expected.items():
        got = getattr(signals, name)
        if want is None or got is None:
            if want != got:
                wrong.append(f"{name}: got {got}, want {want}")
        elif not math.isclose(got, want, rel_tol=0.03, abs_tol=1e-6):
            wrong.append(f"{name}: got {got}, want {want}")
    return wrong


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - keep scrapes out of the test output
        pass


def _serve_text_format(registry: CollectorRegistry):
    """A /metrics server that always answers in text format 0.0.4, whatever the Accept header asks."""

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
        return [generate_latest(registry)]

    server = make_server("127.0.0.1", 0, app, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def engines() -> Iterator[list[FakeEngine]]:
    started: list[FakeEngine] = []
    try:
        for labels, load in FLEET:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(LinearEngineCollector(load))
            if load.names is SGLANG_METRICS:
                server = _serve_text_format(registry)
            else:
                server, _thread = start_http_server(0, addr="127.0.0.1", registry=registry)
            started.append(FakeEngine(ScrapeTarget(f"127.0.0.1:{server.server_port}", labels), server))
        yield started
    finally:
        for engine in started:
            engine.server.shutdown()
            engine.server.server_close()


@pytest.fixture(scope="module")
def prometheus(engines):
    with start_prometheus([e.target for e in engines], scrape_interval=1.0) as server:
        server.wait_for_healthy_targets(len(engines), timeout=20)
        source = PrometheusSignalSource(server.url, timeout_seconds=5)
        try:
            _wait_for_expected(source)  # rates need a full window of samples before any test reads them
        finally:
            source.close()
        yield server


def _fetch(source: PrometheusSignalSource, engine_kind: str, pdd: str, namespace: str = NAMESPACE):
    return source.fetch(engine_kind, namespace, pdd, WINDOW_S, 90, at=time.time())


def _wait_for_expected(source: PrometheusSignalSource, timeout: float = 25.0) -> dict:
    """Poll until every expected pool reads as expected (rates need a full window of samples); return the last."""
    deadline = time.monotonic() + timeout
    while True:
        readings = {pdd: _fetch(source, kind, pdd) for pdd, kind in (("llama", "vllm"), ("sgl", "sglang"))}
        problems = {
            key: (_matches(r, want) if isinstance(r, PoolSignals) else [repr(r)])
            for key, want in EXPECTED.items()
            for r in [readings[key[0]][key[1]]]
        }
        if not any(problems.values()) or time.monotonic() > deadline:
            return problems
        time.sleep(0.5)


def test_every_query_returns_the_exported_values(prometheus):
    source = PrometheusSignalSource(prometheus.url, timeout_seconds=2.5)  # a fractional server-side timeout too
    try:
        problems = _wait_for_expected(source, timeout=5)
        assert not any(problems.values()), problems
        started = time.perf_counter()
        _fetch(source, "vllm", "llama")
        elapsed = time.perf_counter() - started
    finally:
        source.close()
    assert queries_per_interval() == 11
    assert elapsed < 1.0, f"one interval's {queries_per_interval()} queries took {elapsed:.3f}s"


def test_the_prompt_histogram_is_read_per_pool_with_its_buckets(prometheus):
    source = PrometheusSignalSource(prometheus.url, timeout_seconds=5)
    try:
        readings = _fetch(source, "vllm", "llama")
        sglang = _fetch(source, "sglang", "sgl")
    finally:
        source.close()
    # 3 req/s at <= 1,000 computed tokens over both prefill pods, 2 req/s between 5,000 and 10,000
    histogram = readings["prefill"].prefill_tokens
    assert [bound for bound, _ in histogram.buckets] == [*PROMPT_BUCKETS, math.inf]
    assert histogram.total == pytest.approx(5.0, rel=0.03)
    assert histogram.quantile(0.5) == pytest.approx(1000 * 2.5 / 3, rel=0.03)
    assert histogram.share_above(1000) == pytest.approx(0.4, rel=0.03)
    assert readings["decode"].prefill_tokens.total == 0.0  # exported, no request counted
    assert readings["prefill"].computed_tps == pytest.approx(3 * 1000 + 2 * 10000, rel=0.03)  # the histogram's _sum
    assert sglang["prefill"].prefill_tokens is None and sglang["prefill"].computed_tps is None  # no query for SGLang


def test_both_metric_name_spellings_are_stored(prometheus):
    """The premise of the fleet: one engine kind is stored as `vllm_*`, the other as `sglang:*`."""
    stored = {}
    for name, pattern in (("vllm_", "vllm_num_requests_waiting"), ("sglang:", "sglang:num_queue_reqs")):
        response = httpx.get(f"{prometheus.url}/api/v1/query", params={"query": f'count({{__name__="{pattern}"}})'})
        stored[name] = response.json()["data"]["result"]
    assert stored["vllm_"] and stored["sglang:"], stored


def test_cli_reads_signals(prometheus, capsys):
    argv = [
        "signals",
        "--prometheus",
        prometheus.url,
        "--namespace",
        NAMESPACE,
        "--pdd",
        "llama",
        "--window",
        str(WINDOW_S),
    ]
    assert autoscale_cli.main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["prefill"]["type"] == "PoolSignals" and printed["prefill"]["replicas_reporting"] == 2


def test_pool_without_series_is_unavailable_not_zero(prometheus):
    source = PrometheusSignalSource(prometheus.url, timeout_seconds=5)
    try:
        half = _fetch(source, "vllm", "half")
        absent = _fetch(source, "vllm", 'no"such\\pdd')
    finally:
        source.close()
    assert isinstance(half["prefill"], PoolSignals) and half["prefill"].replicas_reporting == 1
    assert half["decode"] == MetricsUnavailable("decode", NO_SAMPLES, half["decode"].message)
    assert {r.reason for r in absent.values()} == {NO_SAMPLES}


def test_removed_target_stops_counting_as_reporting(prometheus, engines):
    source = PrometheusSignalSource(prometheus.url, timeout_seconds=5)
    removed = "llama-prefill-rack-b-0"
    try:
        prometheus.set_targets([e.target for e in engines if e.target.labels["pod"] != removed])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            reading = _fetch(source, "vllm", "llama")["prefill"]
            # the queries of one fetch may straddle the staleness markers' append: wait for a consistent reading
            if isinstance(reading, PoolSignals) and (reading.replicas_reporting, reading.queue_total) == (1, 3):
                break
            time.sleep(0.5)
    finally:
        prometheus.set_targets([e.target for e in engines])
        source.close()
    assert reading.replicas_reporting == 1
    assert reading.queue_total == 3 and reading.running_total == 2


def test_bad_query_is_a_query_error(prometheus):
    source = PrometheusSignalSource(prometheus.url, timeout_seconds=5)
    try:
        readings = source.fetch("vllm", NAMESPACE, "llama", 0, 90, at=time.time())  # [0s] is not a valid range
    finally:
        source.close()
    assert {r.reason for r in readings.values()} == {QUERY_ERROR}


def test_prometheus_down_is_unreachable():
    source = PrometheusSignalSource(f"http://127.0.0.1:{free_port()}", timeout_seconds=1)
    try:
        started = time.monotonic()
        readings = _fetch(source, "vllm", "llama")
        elapsed = time.monotonic() - started
    finally:
        source.close()
    assert {r.reason for r in readings.values()} == {UNREACHABLE}
    assert "unreachable" in readings["prefill"].message
    assert elapsed < 1.0  # one attempt, no retry storm


def test_prometheus_that_never_answers_times_out():
    with socket.socket() as listener:  # accepts connections (backlog) but never replies
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        source = PrometheusSignalSource(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_seconds=0.3)
        try:
            started = time.monotonic()
            readings = _fetch(source, "vllm", "llama")
            elapsed = time.monotonic() - started
        finally:
            source.close()
    assert {r.reason for r in readings.values()} == {TIMEOUT}
    assert elapsed < 1.5  # stops at the first query's timeout
