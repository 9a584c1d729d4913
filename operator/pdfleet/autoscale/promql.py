"""Every PromQL query the autoscaler runs, in one place.

Label convention (see docs/autoscaling.md): Prometheus relabels each engine pod's labels into the target labels
`namespace`, `pdd` (app.kubernetes.io/instance), `pool` (pdfleet.dev/pool), `rack` (pdfleet.dev/rack) and `pod`.
Every query selects one PDDeployment by `namespace` and `pdd` and aggregates `by (pool)`, so one query per signal
serves both pools: an autoscaler interval costs `len(fleet_queries(...))` queries per PDDeployment, whatever the
number of pools or replicas.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pdfleet import POOLS


class Signal(str, enum.Enum):
    """A per-pool measurement the policy can act on; the value names the PoolSignals field it fills."""

    TTFT_P = "ttft_p"
    ITL_P = "itl_p"
    QUEUE_TOTAL = "queue_total"
    RUNNING_TOTAL = "running_total"
    KV_USAGE = "kv_usage"
    PROMPT_TPS = "prompt_tps"
    GEN_TPS = "gen_tps"
    REQUEST_RATE = "request_rate"
    REPLICAS_REPORTING = "replicas_reporting"
    PREFILL_TOKENS = "prefill_tokens"
    COMPUTED_TPS = "computed_tps"


# Signals answering one sample per (pool, le): a histogram's bucket rates, read whole into a TokenHistogram
DISTRIBUTIONS = frozenset({Signal.PREFILL_TOKENS})
# Signals a reading may lack and still be decided on (an engine that does not export them, e.g. SGLang)
OPTIONAL = frozenset({Signal.PREFILL_TOKENS, Signal.COMPUTED_TPS})


@dataclass(frozen=True)
class EngineMetricNames:
    """The metric names one engine kind exports for the signals the autoscaler reads."""

    ttft_histogram: str
    itl_histogram: str
    e2e_histogram: str
    waiting_gauge: str
    running_gauge: str
    kv_usage_gauge: str
    prompt_tokens_counter: str
    generation_tokens_counter: str
    prefill_tokens_histogram: str | None = None  # per request, prompt tokens computed (not served from a cache)


VLLM_METRICS = EngineMetricNames(
    ttft_histogram="vllm:time_to_first_token_seconds",
    itl_histogram="vllm:inter_token_latency_seconds",
    e2e_histogram="vllm:e2e_request_latency_seconds",
    waiting_gauge="vllm:num_requests_waiting",
    running_gauge="vllm:num_requests_running",
    kv_usage_gauge="vllm:kv_cache_usage_perc",
    prompt_tokens_counter="vllm:prompt_tokens_total",
    generation_tokens_counter="vllm:generation_tokens_total",
    prefill_tokens_histogram="vllm:request_prefill_kv_computed_tokens",
)

# SGLang's collector (python/sglang/srt/metrics/collector.py) names; its TPOT histogram is the ITL one.
SGLANG_METRICS = EngineMetricNames(
    ttft_histogram="sglang:time_to_first_token_seconds",
    itl_histogram="sglang:inter_token_latency_seconds",
    e2e_histogram="sglang:e2e_request_latency_seconds",
    waiting_gauge="sglang:num_queue_reqs",
    running_gauge="sglang:num_running_reqs",
    kv_usage_gauge="sglang:token_usage",
    prompt_tokens_counter="sglang:prompt_tokens_total",
    generation_tokens_counter="sglang:generation_tokens_total",
)

ENGINE_METRICS: dict[str, EngineMetricNames] = {"vllm": VLLM_METRICS, "sglang": SGLANG_METRICS}


@dataclass(frozen=True)
class Query:
    """One PromQL query returning one sample per pool (label `pool`) for `signal`, in `unit` (per (pool, le) for the
    DISTRIBUTIONS)."""

    signal: Signal
    promql: str
    unit: str
    doc: str


def metric_names(engine_kind: str) -> EngineMetricNames:
    """Metric names for `engine_kind` (`vllm` or `sglang`); the emulator exports the vLLM names."""
    try:
        return ENGINE_METRICS[engine_kind]
    except KeyError:
        raise ValueError(f"unknown engine kind {engine_kind!r}; expected one of {sorted(ENGINE_METRICS)}") from None


def _quote(value: str) -> str:
    """A PromQL double-quoted string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def fleet_selector(namespace: str, pdd: str) -> str:
    """Label matchers for every engine series of one PDDeployment (both pools)."""
    pools = "|".join(POOLS)
    return f"namespace={_quote(namespace)},pdd={_quote(pdd)},pool=~{_quote(pools)}"


def series(metric: str, selector: str) -> str:
    """Vector selector for `metric` under either spelling of its prefix separator (`vllm:x` or `vllm_x`).

    prometheus_client >= 0.2x answers Prometheus 2.x's OpenMetrics scrape with ':' escaped to '_' in sample names
    (prometheus/client_python#1177), so an engine's `vllm:num_requests_waiting` may be stored as
    `vllm_num_requests_waiting`; matching both keeps the queries right with either scraper.
    """
    return "{" + f"__name__=~{_quote(metric.replace(':', '[:_]'))},{selector}" + "}"


def _quantile(percentile: float) -> float:
    """SLA percentile (e.g. 90) as a histogram_quantile argument (0.9)."""
    if not 0 < percentile < 100:
        raise ValueError(f"percentile must be in (0, 100), got {percentile}")
    return percentile / 100.0


def fleet_queries(
    engine_kind: str, namespace: str, pdd: str, window_seconds: int, percentile: float
) -> tuple[Query, ...]:
    """All queries of one autoscaler interval for one PDDeployment, one per Signal, each grouped `by (pool)`.

    `window_seconds` is the rate/quantile window (spec.autoscaler.windowSeconds); it must span at least two scrapes.
    """
    names = metric_names(engine_kind)
    sel = fleet_selector(namespace, pdd)
    w = f"{int(window_seconds)}s"
    q = _quantile(percentile)
    pct = f"p{percentile:g}"
    ttft_buckets = series(names.ttft_histogram + "_bucket", sel)
    itl_buckets = series(names.itl_histogram + "_bucket", sel)
    finished = series(names.e2e_histogram + "_count", sel)
    waiting = series(names.waiting_gauge, sel)
    running = series(names.running_gauge, sel)
    kv_usage = series(names.kv_usage_gauge, sel)
    prompt_tokens = series(names.prompt_tokens_counter, sel)
    generation_tokens = series(names.generation_tokens_counter, sel)
    queries = (
        Query(
            Signal.TTFT_P,
            f"histogram_quantile({q:g}, sum by (pool, le) (rate({ttft_buckets}[{w}])))",
            "seconds",
            f"TTFT {pct} over the window across the pool's replicas; the prefill SLA signal. NaN when the pool "
            "served no request in the window.",
        ),
        Query(
            Signal.ITL_P,
            f"histogram_quantile({q:g}, sum by (pool, le) (rate({itl_buckets}[{w}])))",
            "seconds",
            f"Inter-token latency {pct} (the SLA's TPOT) over the window; the decode SLA signal. NaN when no token "
            "was generated in the window.",
        ),
        Query(
            Signal.QUEUE_TOTAL,
            f"sum by (pool) ({waiting})",
            "requests",
            "Requests waiting for admission, summed over the pool now; divided by replicas it is compared with "
            "targetQueueDepthPerReplica.",
        ),
        Query(
            Signal.RUNNING_TOTAL,
            f"sum by (pool) ({running})",
            "requests",
            "Requests in the running batch, summed over the pool now (decode concurrency).",
        ),
        Query(
            Signal.KV_USAGE,
            f"avg by (pool) ({kv_usage})",
            "fraction",
            "KV cache usage (0..1) averaged over the pool's replicas now; reported, not acted on.",
        ),
        Query(
            Signal.PROMPT_TPS,
            f"sum by (pool) (rate({prompt_tokens}[{w}]))",
            "tokens/s",
            "Prompt tokens processed per second by the pool; the prefill capacity signal.",
        ),
        Query(
            Signal.GEN_TPS,
            f"sum by (pool) (rate({generation_tokens}[{w}]))",
            "tokens/s",
            "Tokens generated per second by the pool; the decode capacity signal.",
        ),
        Query(
            Signal.REQUEST_RATE,
            f"sum by (pool) (rate({finished}[{w}]))",
            "requests/s",
            "Requests finished per second by the pool; with the token rates it gives tokens per request.",
        ),
        Query(
            Signal.REPLICAS_REPORTING,
            f"count by (pool) (count by (pool, pod) ({running}))",
            "replicas",
            "Pods whose latest scrape succeeded (a failed or removed target goes stale at once); 0 or absent means "
            "no data, never zero load.",
        ),
    )
    if names.prefill_tokens_histogram is None:
        return queries
    prefill_tokens = series(names.prefill_tokens_histogram + "_bucket", sel)
    computed_tokens = series(names.prefill_tokens_histogram + "_sum", sel)
    return queries + (
        Query(
            Signal.PREFILL_TOKENS,
            f"sum by (pool, le) (rate({prefill_tokens}[{w}]))",
            "requests/s per bucket",
            "Requests per second by prompt tokens computed (cache hits excluded), cumulative by `le`: each request's "
            "own prefill work, from which the autoscaler reads the percentile's latency floor and the share of "
            "requests no replica count serves within the TTFT target. Optional: without it the floor uses the mean "
            "prompt.",
        ),
        Query(
            Signal.COMPUTED_TPS,
            f"sum by (pool) (rate({computed_tokens}[{w}]))",
            "tokens/s",
            "Prompt tokens per second the pool computed (prefix-cache hits and pulled KV excluded, unlike prompt_tps): "
            "the prefill's work, which its capacity is compared with. Optional: without it prompt_tps stands in.",
        ),
    )


def queries_per_interval(engine_kind: str = "vllm") -> int:
    """How many queries one autoscaler interval sends per PDDeployment (both pools together)."""
    return len(fleet_queries(engine_kind, "ns", "pdd", 60, 90))
