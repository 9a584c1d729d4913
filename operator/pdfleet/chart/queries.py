"""PromQL building blocks shared by the dashboards and the alert rules.

Engine series are selected exactly as the autoscaler selects them (`pdfleet.autoscale.promql.series`: a name regex
that accepts `vllm:x` and `vllm_x`), over every engine kind (names from pdfleet.autoscale.promql.ENGINE_METRICS), so
one dashboard serves vLLM, SGLang and the emulator alike; one PDDeployment runs one kind, so sums never mix them.
Target labels follow the scrape convention: namespace, pdd, pool, rack, pod.
"""

from __future__ import annotations

from pdfleet import POOLS
from pdfleet.autoscale.promql import ENGINE_METRICS, series

DASHBOARD_SELECTOR = 'namespace="$namespace", pdd="$pdd"'
ENGINE_POOLS = f'pool=~"{"|".join(POOLS)}"'  # every engine series of a fleet, any PDDeployment
RATE_WINDOW = "$__rate_interval"
QUANTILES = (0.5, 0.9, 0.99)

# vLLM's NIXL connector (vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py); the emulator exports the same
NIXL_XFER_TIME = "vllm:nixl_xfer_time_seconds"  # histogram, decode side: one observation per KV transfer
NIXL_BYTES = "vllm:nixl_bytes_transferred"  # histogram, decode side: bytes per KV transfer
NIXL_FAILED_TRANSFERS = "vllm:nixl_num_failed_transfers_total"  # decode side, handshake and notification failures too
NIXL_KV_EXPIRED = "vllm:nixl_num_kv_expired_reqs_total"  # prefill side: KV released unread when its lease ran out


def engine_series(field: str, suffix: str, selector: str) -> str:
    """Series selector of EngineMetricNames.`field` for every engine kind, e.g. the TTFT histogram's `_bucket`."""
    names = sorted({getattr(names, field) + suffix for names in ENGINE_METRICS.values()})
    return series("|".join(names), selector)


def quantile(q: float, buckets: str, by: str, window: str) -> str:
    """histogram_quantile `q` of the `_bucket` series `buckets` selects, aggregated `by` the given labels."""
    return f"histogram_quantile({q:g}, sum by ({by}, le) (rate({buckets}[{window}])))"


def engine_quantile(q: float, field: str, by: str, selector: str, window: str) -> str:
    """histogram_quantile `q` of an engine histogram, aggregated `by` the given labels."""
    return quantile(q, engine_series(field, "_bucket", selector), by, window)


def engine_rate(field: str, by: str, selector: str, window: str, suffix: str = "") -> str:
    """Per-second rate of an engine counter (or histogram `_count`), summed by the given labels."""
    return f"sum by ({by}) (rate({engine_series(field, suffix, selector)}[{window}]))"


def histogram_quantile(q: float, metric: str, by: str, selector: str, window: str) -> str:
    """histogram_quantile `q` of one named histogram (`metric` without `_bucket`)."""
    return quantile(q, f"{metric}_bucket{{{selector}}}", by, window)


def share_within(metric: str, bounds: tuple[float, ...], target: str, selector: str, window: str) -> str:
    """Share of `metric`'s observations at or below the scalar `target`, from its buckets (`bounds`, as exported).

    The count is read at the largest bucket boundary at or below the target (the target itself when it is one), so
    the share is never overstated; 0 when the target lies below every boundary.
    """
    bound_rows = " or ".join(f'label_replace(vector({b!r}), "le", "{b!r}", "", "")' for b in bounds)
    buckets = f"sum by (le) (rate({metric}_bucket{{{selector}}}[{window}]))"
    within = f"max({buckets} and on (le) (({bound_rows}) <= {target})) or vector(0)"
    return ratio(within, f"sum(rate({metric}_count{{{selector}}}[{window}]))")


def ratio(numerator: str, denominator: str) -> str:
    """numerator / denominator, both already aggregated to the same labels."""
    return f"({numerator}) / ({denominator})"
