"""Router metrics (prefix pdfleet_router_): plain counters on the hot path, prometheus_client families at scrape time.

Updating a prometheus_client metric takes a lock and a label lookup; the router counts into dicts and fixed bucket
lists instead and builds the exposition only when /metrics is scraped.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from typing import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

# boundaries at the common SLA targets (0.05 s TPOT, 0.5 s TTFT...), as the SLA-attainment panels count at a boundary
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.05,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
)


class LightHistogram:
    """Fixed-bucket histogram without locks (the router is single-threaded)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Add one observation."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs, ending with +Inf."""
        total, out = 0, []
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            total += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), total))
        return out


# rows of (endpoint, pool, inflight, healthy) for the gauges, provided by the endpoint registry
EndpointRows = Callable[[], Iterable[tuple[str, str, int, bool]]]


class RouterMetrics:
    """All router metrics; also a prometheus_client collector."""

    def __init__(self, endpoint_rows: EndpointRows = lambda: ()) -> None:
        self.endpoint_rows = endpoint_rows
        self.requests: defaultdict[tuple[str, int], int] = defaultdict(int)  # (path, status)
        self.retries: defaultdict[str, int] = defaultdict(int)  # leg
        self.pairs: defaultdict[str, int] = defaultdict(int)  # locality
        self.kv_handshake_failures: defaultdict[str, int] = defaultdict(int)  # reason
        self.upstream_timeouts: defaultdict[tuple[str, str], int] = defaultdict(int)  # (pool, kind)
        self.client_rejections: defaultdict[str, int] = defaultdict(int)  # reason
        self.fallbacks = 0
        self.fleet_generation = 0
        self.fleet_reloads = 0
        self.ttft = LightHistogram()
        self.tpot = LightHistogram()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def collect(self) -> Iterator[Metric]:
        """prometheus_client collector protocol."""
        p = "pdfleet_router_"
        yield _counter(
            p + "requests",
            "Client requests by path and final HTTP status.",
            ("path", "status"),
            [((k[0], str(k[1])), v) for k, v in self.requests.items()],
        )
        yield _counter(
            p + "retries", "Leg retries on another endpoint.", ("leg",), [((k,), v) for k, v in self.retries.items()]
        )
        yield _counter(
            p + "fallbacks",
            "Requests served by a full prefill on a decode after PD failures.",
            (),
            [((), self.fallbacks)],
        )
        yield _counter(
            p + "pairs",
            "Prefill/decode pairs that served a request, by locality.",
            ("locality",),
            [((k,), v) for k, v in self.pairs.items()],
        )
        yield _counter(
            p + "kv_handshake_failures",
            "Two-stage KV handshake failures.",
            ("reason",),
            [((k,), v) for k, v in self.kv_handshake_failures.items()],
        )
        yield _counter(
            p + "upstream_timeouts",
            "Upstream legs that missed a deadline, by pool and kind (first_byte, inter_chunk, total).",
            ("pool", "kind"),
            list(self.upstream_timeouts.items()),
        )
        yield _counter(
            p + "client_rejections",
            "Client requests the HTTP server refused or cut off, by reason (body_too_large, header_too_large, "
            "request_line_too_long, header_timeout, body_timeout, bad_request, internal_error).",
            ("reason",),
            [((k,), v) for k, v in self.client_rejections.items()],
        )
        yield _counter(p + "fleet_reloads", "Fleet views applied.", (), [((), self.fleet_reloads)])
        generation = GaugeMetricFamily(p + "fleet_generation", "Generation of the fleet view in use.")
        generation.add_metric([], self.fleet_generation)
        yield generation
        for name, hist, doc in (
            ("ttft_seconds", self.ttft, "Client-seen time to first streamed chunk."),
            ("tpot_seconds", self.tpot, "Client-seen mean time between streamed chunks."),
        ):
            family = HistogramMetricFamily(p + name, doc)
            family.add_metric([], hist.cumulative(), hist.sum)
            yield family
        inflight = GaugeMetricFamily(p + "inflight", "Requests in flight per endpoint.", labels=("endpoint", "pool"))
        healthy = GaugeMetricFamily(
            p + "endpoint_healthy", "1 if the endpoint passes health checks.", labels=("endpoint", "pool")
        )
        for name, pool, count, ok in self.endpoint_rows():
            inflight.add_metric([name, pool], count)
            healthy.add_metric([name, pool], 1 if ok else 0)
        yield inflight
        yield healthy

    def render(self) -> bytes:
        """Prometheus text exposition."""
        return generate_latest(self.registry)


def _counter(name: str, doc: str, labels: tuple[str, ...], rows: Iterable[tuple[tuple[str, ...], int]]) -> Metric:
    family = CounterMetricFamily(name, doc, labels=labels)
    for values, count in rows:
        family.add_metric(list(values), count)
    return family
