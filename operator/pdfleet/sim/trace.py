"""Request traces: the record the simulator replays, and readers for the public CSV/JSONL formats.

A trace is a list of TraceRequest sorted by arrival, with arrival times in seconds from the first request.
Readers accept the Azure LLM inference trace 2023 columns (TIMESTAMP,ContextTokens,GeneratedTokens), Mooncake's JSON
Lines (timestamp in ms, input_length, output_length, hash_ids of 512-token blocks) and a generic form (arrival_s,
prompt_tokens, output_tokens[, prefix_blocks]) in CSV or JSON Lines; any other numeric arrival column needs its unit.
"""

from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Mapping

ARRIVAL_KEYS = ("arrival_s", "arrival", "TIMESTAMP", "timestamp")
PROMPT_KEYS = ("prompt_tokens", "ContextTokens", "input_length", "input_tokens")
OUTPUT_KEYS = ("output_tokens", "GeneratedTokens", "output_length")
PREFIX_KEYS = ("prefix_blocks", "hash_ids")
TIME_UNITS = {"s": 1.0, "ms": 1e-3}
MOONCAKE_KEYS = frozenset({"timestamp", "input_length", "output_length", "hash_ids"})
MOONCAKE_BLOCK_TOKENS = 512  # Mooncake's published traces hash prompts in 512-token blocks
MAX_TRACE_SPAN_S = 7 * 86400.0  # a longer span means the time unit was read wrong


@dataclass(frozen=True)
class TraceRequest:
    """One request: arrival (s from trace start), token counts, and the ids of its leading prompt blocks.

    Equal prefix-block ids at the same positions mean a shared prompt prefix (a cache hit when the same prefill holds
    it); each block covers `prefix_block_tokens` tokens of the fleet's router policy.
    """

    arrival: float
    prompt_tokens: int
    output_tokens: int
    prefix_blocks: tuple[int, ...] = ()


@dataclass(frozen=True)
class TraceFormat:
    """How a file's rows read: the unit of its numeric arrival column and the tokens one of its prefix ids covers."""

    name: str
    time_unit: str | None  # None: numeric arrivals are ambiguous (the reader refuses them without a unit)
    block_tokens: int | None = None  # None: prefix ids are already in the router's blocks


def trace_format(row: Mapping[str, Any]) -> TraceFormat:
    """The format of a trace from its first row's columns; the unit of time is fixed by the format where it can be."""
    if MOONCAKE_KEYS <= row.keys():
        return TraceFormat("mooncake", "ms", MOONCAKE_BLOCK_TOKENS)
    if "arrival_s" in row:
        return TraceFormat("generic", "s")
    if "TIMESTAMP" in row and "ContextTokens" in row:
        return TraceFormat("azure2023", "s")  # ISO date-times; seconds if numeric
    return TraceFormat("generic", None)


def _first(row: Mapping[str, Any], keys: tuple[str, ...], what: str) -> Any:
    for key in keys:
        value = row.get(key)
        if value not in (None, ""):
            return value
    raise ValueError(f"trace row has no {what} column (looked for {', '.join(keys)}): {dict(row)}")


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        return None


def _seconds(value: Any, unit: str | None) -> float:
    """A numeric timestamp in `unit`, or an ISO-like date-time (Azure: '2023-11-16 18:17:03.9799600')."""
    number = _number(value)
    if number is not None:
        if unit is None:
            raise ValueError(
                f"numeric arrival {value!r} in a trace whose time unit is not fixed by its format: "
                f"give the unit (--time-unit {' or '.join(TIME_UNITS)})"
            )
        return number * TIME_UNITS[unit]
    date, _, fraction = str(value).strip().partition(".")
    stamp = datetime.fromisoformat(date).timestamp()
    return stamp + (float("0." + fraction) if fraction else 0.0)


def _prefix(value: Any, split: int) -> tuple[int, ...]:
    """Prefix ids as router blocks: each id of a coarser trace block becomes `split` consecutive router-block ids."""
    if value in (None, ""):
        return ()
    if isinstance(value, str):
        value = json.loads(value) if value.strip().startswith("[") else value.split()
    return tuple(int(v) * split + k for v in value for k in range(split))


def request_from_row(
    row: Mapping[str, Any], unit: str | None = "s", split: int = 1
) -> tuple[float, int, int, tuple[int, ...]]:
    """(absolute arrival s, prompt tokens, output tokens, prefix blocks) of one CSV/JSON row.

    `unit` is the unit of a numeric arrival (None refuses one); `split` router blocks make one trace prefix block.
    """
    prefix = next((row[k] for k in PREFIX_KEYS if k in row), None)
    return (
        _seconds(_first(row, ARRIVAL_KEYS, "arrival"), unit),
        max(1, int(float(_first(row, PROMPT_KEYS, "prompt tokens")))),
        max(1, int(float(_first(row, OUTPUT_KEYS, "output tokens")))),
        _prefix(prefix, split),
    )


def normalize(rows: Iterable[tuple[float, int, int, tuple[int, ...]]]) -> list[TraceRequest]:
    """Sort by arrival and shift times so the first request arrives at 0."""
    ordered = sorted(rows, key=lambda r: r[0])
    if not ordered:
        return []
    start = ordered[0][0]
    return [TraceRequest(t - start, p, o, b) for t, p, o, b in ordered]


def read_trace(
    path: str | Path, limit: int | None = None, time_unit: str | None = None, block_tokens: int = 64
) -> list[TraceRequest]:
    """Read a CSV (header row) or JSON Lines trace; `limit` keeps the first N rows of the file.

    The unit of numeric arrivals comes from the format (Mooncake JSONL `timestamp`: ms; `arrival_s`: s) or from
    `time_unit` ("s" | "ms", which overrides it); a numeric arrival of unknown unit, or a span over 7 days, is refused.
    Prefix ids of a format with coarser blocks (Mooncake: 512 tokens) are split into `block_tokens` router blocks.
    """
    if time_unit is not None and time_unit not in TIME_UNITS:
        raise ValueError(f"time unit must be one of {', '.join(TIME_UNITS)}, not {time_unit!r}")
    path = Path(path)
    rows: list[tuple[float, int, int, tuple[int, ...]]] = []
    fmt: TraceFormat | None = None
    unit, split = time_unit, 1
    with path.open(newline="") as handle:
        if path.suffix in (".jsonl", ".json", ".ndjson"):
            records: Iterable[Mapping[str, Any]] = (json.loads(line) for line in handle if line.strip())
        else:
            records = csv.DictReader(handle)
        for record in records:
            if limit is not None and len(rows) >= limit:
                break
            if fmt is None:
                fmt = trace_format(record)
                unit = time_unit or fmt.time_unit
                split = max(1, fmt.block_tokens // block_tokens) if fmt.block_tokens else 1
            rows.append(request_from_row(record, unit, split))
    trace = normalize(rows)
    span = trace[-1].arrival if trace else 0.0
    if span > MAX_TRACE_SPAN_S:
        raise ValueError(
            f"{path.name}: arrivals span {span / 86400:.1f} days read as {unit or 'date-times'}; "
            "that is not a request trace's span (wrong time unit? pass --time-unit)"
        )
    return trace


def write_jsonl(requests: Iterable[TraceRequest], path: str | Path) -> None:
    """Write a trace in the generic JSON Lines form `read_trace` reads back."""
    with Path(path).open("w") as handle:
        for r in requests:
            record: dict[str, Any] = {
                "arrival_s": round(r.arrival, 6),
                "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens,
            }
            if r.prefix_blocks:
                record["prefix_blocks"] = list(r.prefix_blocks)
            handle.write(json.dumps(record) + "\n")


def scale_load(requests: list[TraceRequest], factor: int, jitter_s: float = 30.0, seed: int = 0) -> list[TraceRequest]:
    """Superpose `factor` copies of a trace, each shifted by a uniform offset in [0, jitter_s), wrapped into the span.

    Multiplies the request rate while keeping the per-minute shape (bursts and lulls) of the original. Copy c maps
    prefix id b to b * factor + c: prompts share prefixes within a copy as in the original, never across copies.
    """
    if factor <= 1 or not requests:
        return list(requests)
    span = requests[-1].arrival + 1e-6
    rng = random.Random(seed)
    out = [replace(r, prefix_blocks=tuple(b * factor for b in r.prefix_blocks)) for r in requests]
    for copy in range(1, factor):
        offset = rng.uniform(0.0, jitter_s)
        out.extend(
            replace(
                r,
                arrival=(r.arrival + offset) % span,
                prefix_blocks=tuple(b * factor + copy for b in r.prefix_blocks),
            )
            for r in requests
        )
    out.sort(key=lambda r: r.arrival)
    return out


def add_shared_prefixes(
    requests: list[TraceRequest], groups: int, prefix_tokens: int, share: float, block_tokens: int, seed: int = 0
) -> list[TraceRequest]:
    """Give a `share` of requests one of `groups` shared system prompts of `prefix_tokens` tokens (Zipf-like choice).

    The public traces carry no prefix ids; this is how prefix-affinity studies get them. Only prompts longer than the
    prefix get one; group g's blocks are ids g*10^6 + k, so groups never collide.
    """
    rng = random.Random(seed)
    blocks = max(1, prefix_tokens // block_tokens)
    weights = [1.0 / (g + 1) for g in range(groups)]
    out = []
    for r in requests:
        if r.prompt_tokens > prefix_tokens and rng.random() < share:
            g = rng.choices(range(groups), weights)[0]
            r = replace(r, prefix_blocks=tuple(g * 1_000_000 + k for k in range(blocks)))
        out.append(r)
    return out


def trace_stats(requests: list[TraceRequest]) -> dict[str, float]:
    """Count, duration, mean rate and mean token counts of a trace."""
    if not requests:
        return {"requests": 0, "duration_s": 0.0, "rate_rps": 0.0, "mean_prompt": 0.0, "mean_output": 0.0}
    duration = max(requests[-1].arrival, 1e-9)
    return {
        "requests": len(requests),
        "duration_s": duration,
        "rate_rps": len(requests) / duration,
        "mean_prompt": sum(r.prompt_tokens for r in requests) / len(requests),
        "mean_output": sum(r.output_tokens for r in requests) / len(requests),
    }
