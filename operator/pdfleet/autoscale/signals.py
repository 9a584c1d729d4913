"""Per-pool autoscaling signals read from Prometheus.

`signals_from_results` is pure (query results -> PoolSignals / MetricsUnavailable per pool); `PrometheusSignalSource`
is the thin adapter that sends the queries of `promql.fleet_queries` with one bounded timeout and no retries.

A query can answer without a sample for a pool (its series are not scraped, or too young for a rate): that signal is
*missing*, unlike a NaN sample, which is a value-less answer (a latency quantile of an idle pool). `complete_reading`
turns a reading with missing signals into MetricsUnavailable(missing_signals), so the policy never decides on half a
reading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence, Union

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from pdfleet import POOLS
from pdfleet.autoscale.promql import DISTRIBUTIONS, OPTIONAL, Query, Signal, fleet_queries

# MetricsUnavailable.reason values
UNREACHABLE = "unreachable"
TIMEOUT = "timeout"
QUERY_ERROR = "query_error"
BAD_RESPONSE = "bad_response"
NO_SAMPLES = "no_samples"
MISSING_SIGNALS = "missing_signals"


@dataclass(frozen=True)
class TokenHistogram:
    """A cumulative histogram of per-request token counts over the window: (upper bound, requests/s at or below it),
    bounds ascending, the last one +Inf, as Prometheus buckets are."""

    buckets: tuple[tuple[float, float], ...]

    @property
    def total(self) -> float:
        """Requests/s in all buckets."""
        return self.buckets[-1][1] if self.buckets else 0.0

    def quantile(self, q: float) -> float | None:
        """Token count at quantile q (0..1), interpolated inside its bucket as histogram_quantile does (the highest
        finite bound when it falls in the +Inf bucket); None without requests."""
        total = self.total
        if total <= 0:
            return None
        rank, lower, below = q * total, 0.0, 0.0
        for bound, count in self.buckets:
            if count >= rank:
                if math.isinf(bound):
                    return lower
                return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 1.0)
            lower, below = bound, count
        return lower

    def share_above(self, tokens: float) -> float | None:
        """Share (0..1) of requests over `tokens`, interpolated inside its bucket; None without requests."""
        total = self.total
        if total <= 0:
            return None
        lower, below = 0.0, 0.0
        for bound, count in self.buckets:
            if tokens < bound:
                within = below if math.isinf(bound) else below + (count - below) * (tokens - lower) / (bound - lower)
                return max(0.0, 1.0 - within / total)
            lower, below = bound, count
        return 0.0


@dataclass(frozen=True)
class PoolSignals:
    """What one pool looked like at `fetched_at` (unix seconds). None = no value (e.g. latency of an idle pool)."""

    pool: str
    ttft_p: float | None  # seconds
    itl_p: float | None  # seconds
    queue_total: float | None  # requests waiting, whole pool
    running_total: float | None  # requests running, whole pool
    kv_usage: float | None  # fraction 0..1, pool average
    prompt_tps: float | None  # prompt tokens/s, whole pool
    gen_tps: float | None  # generated tokens/s, whole pool
    request_rate: float | None  # finished requests/s, whole pool
    replicas_reporting: int
    fetched_at: float
    missing: tuple[str, ...] = ()  # signals whose query answered without a sample for this pool (sorted names)
    prefill_tokens: TokenHistogram | None = None  # prompt tokens computed per request (optional: not every engine)
    computed_tps: float | None = None  # prompt tokens/s computed, cache hits excluded (optional, as above)

    @property
    def queue_per_replica(self) -> float | None:
        """Average waiting requests per reporting replica."""
        if self.queue_total is None or self.replicas_reporting <= 0:
            return None
        return self.queue_total / self.replicas_reporting


@dataclass(frozen=True)
class MetricsUnavailable:
    """No usable metrics for a pool: `reason` is one of the module's reason constants, `message` says why."""

    pool: str
    reason: str
    message: str
    missing: tuple[str, ...] = ()  # with reason missing_signals: the signals that had no sample


PoolReading = Union[PoolSignals, MetricsUnavailable]


def _sample_value(sample: Mapping[str, Any]) -> float | None:
    """Float of an instant-vector sample; None for NaN/Inf (Prometheus sends them as strings) or malformed values."""
    try:
        value = float(sample["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _by_pool(result: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Index one query's instant vector by its `pool` label."""
    values: dict[str, float | None] = {}
    for sample in result:
        pool = sample.get("metric", {}).get("pool")
        if pool is not None:
            values[pool] = _sample_value(sample)
    return values


def _histograms_by_pool(result: Sequence[Mapping[str, Any]]) -> dict[str, TokenHistogram]:
    """Bucket samples (labels pool, le) -> a TokenHistogram per pool; NaN buckets and unparsable bounds are dropped."""
    buckets: dict[str, list[tuple[float, float]]] = {}
    for sample in result:
        labels = sample.get("metric", {})
        value = _sample_value(sample)
        try:
            bound = float(labels.get("le", ""))
        except ValueError:
            continue
        if labels.get("pool") is not None and value is not None:
            buckets.setdefault(labels["pool"], []).append((bound, value))
    return {pool: TokenHistogram(tuple(sorted(found))) for pool, found in buckets.items()}


def signals_from_results(
    results: Mapping[Signal, Sequence[Mapping[str, Any]]], fetched_at: float, pools: Sequence[str] = POOLS
) -> dict[str, PoolReading]:
    """Turn raw instant-vector results (one per Signal) into a reading per pool.

    A pool with no reporting replica is MetricsUnavailable(no_samples): absence of data is never read as zero load.
    """
    indexed = {signal: _by_pool(result) for signal, result in results.items() if signal not in DISTRIBUTIONS}
    histograms = {signal: _histograms_by_pool(results.get(signal, ())) for signal in DISTRIBUTIONS}
    scalars = [signal for signal in Signal if signal not in DISTRIBUTIONS]
    readings: dict[str, PoolReading] = {}
    for pool in pools:
        reporting = indexed.get(Signal.REPLICAS_REPORTING, {}).get(pool)
        if not reporting:
            readings[pool] = MetricsUnavailable(
                pool, NO_SAMPLES, f"no {pool} replica reported engine metrics in the latest scrape"
            )
            continue
        values: dict[str, Any] = {signal.value: indexed.get(signal, {}).get(pool) for signal in scalars}
        values[Signal.REPLICAS_REPORTING.value] = int(reporting)
        values.update({signal.value: by_pool.get(pool) for signal, by_pool in histograms.items()})
        missing = tuple(sorted(s.value for s in scalars if s not in OPTIONAL and pool not in indexed.get(s, {})))
        readings[pool] = PoolSignals(pool=pool, fetched_at=fetched_at, missing=missing, **values)
    return readings


def complete_reading(reading: PoolReading) -> PoolReading:
    """The reading itself, or MetricsUnavailable(missing_signals) naming the signals it lacks."""
    if isinstance(reading, PoolSignals) and reading.missing:
        return MetricsUnavailable(
            reading.pool,
            MISSING_SIGNALS,
            f"no {reading.pool} sample for {', '.join(reading.missing)} (their queries answered for other series"
            " only: check the engines export them and Prometheus scrapes them)",
            reading.missing,
        )
    return reading


class PrometheusSignalSource:
    """Reads PoolSignals for one PDDeployment from Prometheus: one query per Signal, all at the same instant."""

    def __init__(self, url: str, timeout_seconds: float = 5.0) -> None:
        self.url = url
        self.timeout_seconds = timeout_seconds
        # one attempt per query (the next interval is the retry); read=False surfaces read timeouts as such
        no_retry = Retry(total=0, read=False, backoff_factor=0)
        self._client = PrometheusConnect(url=url, retry=no_retry, timeout=timeout_seconds)

    def close(self) -> None:
        """Release the HTTP session."""
        self._client.close()

    def fetch(
        self,
        engine_kind: str,
        namespace: str,
        pdd: str,
        window_seconds: int,
        percentile: float,
        at: float,
    ) -> dict[str, PoolReading]:
        """Evaluate every query at unix time `at`; on the first failure every pool is MetricsUnavailable."""
        results: dict[Signal, Sequence[Mapping[str, Any]]] = {}
        try:
            for query in fleet_queries(engine_kind, namespace, pdd, window_seconds, percentile):
                results[query.signal] = self._run(query, at)
        except _QueryFailed as failure:
            return {pool: MetricsUnavailable(pool, failure.reason, failure.message) for pool in POOLS}
        return signals_from_results(results, fetched_at=at)

    def _run(self, query: Query, at: float) -> Sequence[Mapping[str, Any]]:
        """One instant query; every failure becomes _QueryFailed with a reason constant."""
        # plain float seconds: Prometheus rejects fractional duration strings such as "0.5s"
        params = {"time": f"{at:.3f}", "timeout": f"{self.timeout_seconds:g}"}
        name = query.signal.value
        try:
            result = self._client.custom_query(query.promql, params=params)
        except requests.Timeout as exc:
            raise _QueryFailed(
                TIMEOUT, f"Prometheus {self.url} gave no answer to {name} within {self.timeout_seconds:g}s"
            ) from exc
        except requests.RequestException as exc:
            raise _QueryFailed(UNREACHABLE, f"Prometheus {self.url} unreachable: {_root_cause(exc)}") from exc
        except PrometheusApiClientException as exc:
            raise _QueryFailed(QUERY_ERROR, f"query {name} failed: {exc}") from exc
        except (ValueError, KeyError, TypeError) as exc:  # body is not the documented JSON envelope
            raise _QueryFailed(BAD_RESPONSE, f"query {name}: malformed response: {exc!r}") from exc
        if not isinstance(result, list):
            raise _QueryFailed(BAD_RESPONSE, f"query {name}: expected a vector, got {type(result).__name__}")
        return result


def _root_cause(exc: requests.RequestException) -> str:
    """The urllib3 reason behind a requests error, without the (long) query URL."""
    inner = exc.args[0] if exc.args else exc
    return str(getattr(inner, "reason", inner))[:300]


class _QueryFailed(Exception):
    """A query that produced no result; carries the MetricsUnavailable reason and message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
