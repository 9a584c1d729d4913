"""Per-policy numbers from a SimResult: latency percentiles, SLA attainment, goodput, GPU-hours, cost; and tables."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdfleet.sim.core import SimResult

BUCKET_S = 60.0  # timeline resolution of the plots


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank q-quantile (0..1) of values; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(frozen=True)
class PolicySummary:
    """One row of the comparison table."""

    policy: str
    requests: int
    completed: int
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p90_ms: float
    tpot_p99_ms: float
    sla_attainment: float  # share of requests meeting both the TTFT and the TPOT target
    goodput_rps: float  # requests meeting the SLA per second of trace
    gpu_hours: float  # GPUs held (starting, ready or draining) from 0 until the last request finished
    cost_per_mtok_usd: float  # GPU cost over prompt + generated tokens, per million
    cost_per_good_mtok_usd: float  # GPU cost over the tokens of requests that met the SLA, per million
    peak_gpus: int
    events: int
    rejected: int = 0  # requests over the model's context limit, refused (counted as SLA misses)
    unfinished: int = 0  # requests the run ended without (stalled); SLA misses
    warnings: tuple[str, ...] = ()  # what the numbers do not show: denied replicas, stalls, rejections


def gpu_hours(result: SimResult) -> float:
    """GPU-hours held from 0 until the run's end: the last completion (or the last arrival, if later), so a policy
    whose queues drain after the trace pays for the draining."""
    horizon = max(result.horizon_s, result.end_s)
    total = 0.0
    for r in result.replicas:
        end = min(horizon, r.removed_at if r.removed_at is not None else horizon)
        total += max(0.0, end - r.created_at) * r.gpus
    return total / 3600.0


def run_warnings(result: SimResult) -> tuple[str, ...]:
    """Lines for what a row of numbers hides: replicas the racks could not hold, a stalled run, rejected prompts."""
    lines = []
    fleet = result.fleet
    for pool, (decisions, most) in sorted(result.denied.items()):
        lines.append(
            f"{result.policy}: WARNING {pool}: {decisions} scale-ups could not be placed (up to {most} replicas "
            f"missing at once; the racks hold {fleet.total_gpus} GPUs): the policy wanted more than the fleet has"
        )
    if result.stalled:
        lines.append(f"{result.policy}: WARNING run stopped: {result.stalled}")
    lines.extend(result.policy_notes)
    rejected = sum(1 for r in result.records if r.rejected)
    if rejected:
        lines.append(
            f"{result.policy}: WARNING {rejected} requests rejected: prompt + output over the "
            f"{fleet.context_limit}-token context limit"
        )
    return tuple(lines)


def peak_gpus(result: SimResult) -> int:
    """Most GPUs held at once."""
    changes = sorted(
        [(r.created_at, r.gpus) for r in result.replicas]
        + [(r.removed_at, -r.gpus) for r in result.replicas if r.removed_at is not None]
    )
    held = peak = 0
    for _, delta in changes:
        held += delta
        peak = max(peak, held)
    return peak


def meets_sla(ttft: float | None, tpot: float | None, ttft_ms: float, tpot_ms: float) -> bool:
    """Both targets met by one request."""
    return ttft is not None and tpot is not None and ttft * 1000 <= ttft_ms and tpot * 1000 <= tpot_ms


def summarize(result: SimResult) -> PolicySummary:
    """The comparison row of one run."""
    fleet = result.fleet
    done = [r for r in result.records if r.finished_at is not None]
    ttft = [r.ttft * 1000 for r in done if r.ttft is not None]
    tpot = [r.tpot * 1000 for r in done if r.tpot is not None and r.request.output_tokens > 1]
    good_records = [r for r in done if meets_sla(r.ttft, r.tpot, fleet.ttft_ms, fleet.tpot_ms)]
    good = len(good_records)
    good_tokens = sum(r.request.prompt_tokens + r.request.output_tokens for r in good_records)
    n = len(result.records)
    hours = gpu_hours(result)
    tokens = sum(r.request.prompt_tokens + r.request.output_tokens for r in result.records)
    return PolicySummary(
        policy=result.policy,
        requests=n,
        completed=len(done),
        ttft_p50_ms=quantile(ttft, 0.5),
        ttft_p90_ms=quantile(ttft, 0.9),
        ttft_p99_ms=quantile(ttft, 0.99),
        tpot_p50_ms=quantile(tpot, 0.5),
        tpot_p90_ms=quantile(tpot, 0.9),
        tpot_p99_ms=quantile(tpot, 0.99),
        sla_attainment=good / n if n else math.nan,
        goodput_rps=good / max(result.horizon_s, 1e-9),
        gpu_hours=hours,
        cost_per_mtok_usd=hours * fleet.gpu_hour_usd / (tokens / 1e6) if tokens else math.nan,
        cost_per_good_mtok_usd=hours * fleet.gpu_hour_usd / (good_tokens / 1e6) if good_tokens else math.nan,
        peak_gpus=peak_gpus(result),
        events=result.events,
        rejected=sum(1 for r in result.records if r.rejected),
        unfinished=n - len(done) - sum(1 for r in result.records if r.rejected),
        warnings=run_warnings(result),
    )


COLUMNS = (
    ("policy", "policy", "{}"),
    ("requests", "requests", "{}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"),
    ("ttft_p90_ms", "p90", "{:.0f}"),
    ("ttft_p99_ms", "p99", "{:.0f}"),
    ("tpot_p50_ms", "TPOT p50 ms", "{:.1f}"),
    ("tpot_p90_ms", "p90", "{:.1f}"),
    ("tpot_p99_ms", "p99", "{:.1f}"),
    ("sla_attainment", "SLA %", "{:.2%}"),
    ("goodput_rps", "goodput req/s", "{:.2f}"),
    ("gpu_hours", "GPU-h", "{:.1f}"),
    ("cost_per_mtok_usd", "$/Mtok", "{:.3f}"),
    ("cost_per_good_mtok_usd", "$/good Mtok", "{:.3f}"),
    ("peak_gpus", "peak GPUs", "{}"),
)


def markdown_table(rows: list[PolicySummary], baseline: str = "static-peak") -> str:
    """The comparison as a Markdown table, with GPU-hours relative to `baseline` when it is among the rows."""
    base = next((r.gpu_hours for r in rows if r.policy == baseline), None)
    header = [title for _, title, _ in COLUMNS] + ([f"GPU-h vs {baseline}"] if base else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [fmt.format(getattr(row, key)).replace("%", " %") for key, _, fmt in COLUMNS]
        if base:
            cells.append(f"{row.gpu_hours / base:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _dominates(ours: PolicySummary, theirs: PolicySummary) -> bool:
    """Better on one axis (SLA attainment, GPU-hours) and not worse on the other."""
    return (ours.sla_attainment > theirs.sla_attainment and ours.gpu_hours <= theirs.gpu_hours) or (
        ours.gpu_hours < theirs.gpu_hours and ours.sla_attainment >= theirs.sla_attainment
    )


def _family(rows: list[PolicySummary], name: str) -> list[PolicySummary]:
    """A policy and its --tuned variants (`planner`, `planner-h40`, ...)."""
    return [r for r in rows if r.policy == name or r.policy.startswith(name + "-")]


def target_verdict(rows: list[PolicySummary], policy: str = "pdfleet") -> list[str]:
    """Lines saying whether `policy` meets the issue's target against the baselines.

    Where `policy` does not dominate a baseline's own point, the baseline's variants in the run (e.g. a planner given
    headroom) and pdfleet's (e.g. with a GPU budget) compare the two families at equal SLA and at equal cost.
    """
    by_name = {r.policy: r for r in rows}
    ours = by_name.get(policy)
    if ours is None:
        return []
    lines = [
        f"{policy}: SLA attainment {ours.sla_attainment:.2%} (target >= 99 %): "
        f"{'met' if ours.sla_attainment >= 0.99 else 'NOT met'}"
    ]
    peak = by_name.get("static-peak")
    if peak:
        ratio = ours.gpu_hours / peak.gpu_hours
        lines.append(
            f"{policy}: GPU-hours {ratio:.2f}x static-peak (target <= 0.80x): {'met' if ratio <= 0.8 else 'NOT met'}"
        )
    for other in ("hpa-queue", "planner"):
        theirs = by_name.get(other)
        if theirs is None:
            continue
        dominates = _dominates(ours, theirs)
        lines.append(
            f"{policy} vs {other}: SLA {ours.sla_attainment:.2%} vs {theirs.sla_attainment:.2%}, "
            f"GPU-h {ours.gpu_hours:.1f} vs {theirs.gpu_hours:.1f}: "
            f"{'better on one axis, not worse on the other' if dominates else 'does NOT dominate'}"
        )
        if dominates:
            continue
        family = _family(rows, other)
        reaching = [r for r in family if r.sla_attainment >= ours.sla_attainment]
        if reaching:
            cheapest = min(reaching, key=lambda r: r.gpu_hours)
            lines.append(
                f"  at equal SLA: the cheapest {other} run reaching {ours.sla_attainment:.2%} is "
                f"{cheapest.policy} with {cheapest.gpu_hours:.1f} GPU-h vs {ours.gpu_hours:.1f}"
            )
        elif len(family) > 1:
            best = max(family, key=lambda r: r.sla_attainment)
            lines.append(
                f"  at equal SLA: no {other} run reaches {ours.sla_attainment:.2%} (best: {best.policy}, "
                f"{best.sla_attainment:.2%} at {best.gpu_hours:.1f} GPU-h)"
            )
        beaten = [r for r in _family(rows, policy) if _dominates(r, theirs)]
        if beaten:
            best = max(beaten, key=lambda r: r.sla_attainment)
            lines.append(
                f"  at equal cost: {best.policy} dominates {other} "
                f"(SLA {best.sla_attainment:.2%}, GPU-h {best.gpu_hours:.1f})"
            )
    return lines


def timeline(result: SimResult) -> dict[str, list[float]]:
    """Per-minute series for the plots: arrivals/s, p90 TTFT and TPOT (ms) of requests arriving in the minute."""
    if not result.records:
        return {"t": [], "load_rps": [], "ttft_p90_ms": [], "tpot_p90_ms": []}
    count = int(result.horizon_s // BUCKET_S) + 1
    arrivals = [0] * count
    ttft: list[list[float]] = [[] for _ in range(count)]
    tpot: list[list[float]] = [[] for _ in range(count)]
    for r in result.records:
        b = min(count - 1, int(r.request.arrival // BUCKET_S))
        arrivals[b] += 1
        if r.ttft is not None:
            ttft[b].append(r.ttft * 1000)
        if r.tpot is not None and r.request.output_tokens > 1:
            tpot[b].append(r.tpot * 1000)
    return {
        "t": [i * BUCKET_S / 60.0 for i in range(count)],
        "load_rps": [a / BUCKET_S for a in arrivals],
        "ttft_p90_ms": [quantile(v, 0.9) for v in ttft],
        "tpot_p90_ms": [quantile(v, 0.9) for v in tpot],
    }
