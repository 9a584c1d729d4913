"""PromQL building blocks shared by the dashboards and the alert rules.

Engine series are selected by name regex over every engine kind (`vllm:...|sglang:...`, names from
pdfleet.autoscale.promql), so one dashboard serves vLLM, SGLang and the emulator alike; one PDDeployment runs one kind,
so sums never mix them. Target labels follow the scrape convention: namespace, pdd, pool, rack, pod.
"""

from __future__ import annotations

from pdfleet.autoscale.promql import ENGINE_METRICS

DASHBOARD_SELECTOR = 'namespace="$namespace", pdd="$pdd"'
RATE_WINDOW = "$__rate_interval"
QUANTILES = (0.5, 0.9, 0.99)


def engine_series(field: str, suffix: str = "", selector: str = "") -> str:
    """Series selector of EngineMetricNames.`field` for every engine kind, e.g. the TTFT histogram's `_bucket`."""
    names = sorted({getattr(names, field) + suffix for names in ENGINE_METRICS.values()})
    matchers = [f'__name__=~"{"|".join(names)}"'] + ([selector] if selector else [])
    return "{" + ", ".join(matchers) + "}"


def engine_quantile(q: float, field: str, by: str, selector: str, window: str) -> str:
    """histogram_quantile `q` of an engine histogram, aggregated `by` the given labels."""
    buckets = engine_series(field, "_bucket", selector)
    return f"histogram_quantile({q:g}, sum by ({by}, le) (rate({buckets}[{window}])))"


def engine_rate(field: str, by: str, selector: str, window: str, suffix: str = "") -> str:
    """Per-second rate of an engine counter (or histogram `_count`), summed by the given labels."""
    return f"sum by ({by}) (rate({engine_series(field, suffix, selector)}[{window}]))"


def histogram_quantile(q: float, metric: str, by: str, selector: str, window: str) -> str:
    """histogram_quantile `q` of one named histogram (`metric` without `_bucket`)."""
    return f"histogram_quantile({q:g}, sum by ({by}, le) (rate({metric}_bucket{{{selector}}}[{window}])))"


def ratio(numerator: str, denominator: str) -> str:
    """numerator / denominator, both already aggregated to the same labels."""
    return f"({numerator}) / ({denominator})"
