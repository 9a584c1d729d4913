"""Request traces: the record the simulator replays, and readers for the public CSV/JSONL formats.

A trace is a list of TraceRequest sorted by arrival, with arrival times in seconds from the first request.
Readers accept the Azure LLM inference trace 2023 columns (TIMESTAMP,ContextTokens,GeneratedTokens) and a generic
form (arrival_s|timestamp, prompt_tokens, output_tokens[, prefix_blocks]) in CSV or JSON Lines.
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


def _first(row: Mapping[str, Any], keys: tuple[str, ...], what: str) -> Any:
    for key in keys:
        value = row.get(key)
        if value not in (None, ""):
            return value
    raise ValueError(f"trace row has no {what} column (looked for {', '.join(keys)}): {dict(row)}")


def _seconds(value: Any) -> float:
    """A numeric timestamp in seconds, or an ISO-like date-time (Azure: '2023-11-16 18:17:03.9799600')."""
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    date, _, fraction = text.partition(".")
    stamp = datetime.fromisoformat(date).timestamp()
    return stamp + (float("0." + fraction) if fraction else 0.0)


def _prefix(value: Any) -> tuple[int, ...]:
    if value in (None, ""):
        return ()
    if isinstance(value, str):
        value = json.loads(value) if value.strip().startswith("[") else value.split()
    return tuple(int(v) for v in value)


def request_from_row(row: Mapping[str, Any]) -> tuple[float, int, int, tuple[int, ...]]:
    """(absolute arrival s, prompt tokens, output tokens, prefix blocks) of one CSV/JSON row."""
    prefix = next((row[k] for k in PREFIX_KEYS if k in row), None)
    return (
        _seconds(_first(row, ARRIVAL_KEYS, "arrival")),
        max(1, int(float(_first(row, PROMPT_KEYS, "prompt tokens")))),
        max(1, int(float(_first(row, OUTPUT_KEYS, "output tokens")))),
        _prefix(prefix),
    )


def normalize(rows: Iterable[tuple[float, int, int, tuple[int, ...]]]) -> list[TraceRequest]:
    """Sort by arrival and shift times so the first request arrives at 0."""
    ordered = sorted(rows, key=lambda r: r[0])
    if not ordered:
        return []
    start = ordered[0][0]
    return [TraceRequest(t - start, p, o, b) for t, p, o, b in ordered]


def read_trace(path: str | Path, limit: int | None = None) -> list[TraceRequest]:
    """Read a CSV (header row) or JSON Lines trace; `limit` keeps the first N rows of the file."""
    path = Path(path)
    rows: list[tuple[float, int, int, tuple[int, ...]]] = []
    with path.open(newline="") as handle:
        if path.suffix in (".jsonl", ".json", ".ndjson"):
            records: Iterable[Mapping[str, Any]] = (json.loads(line) for line in handle if line.strip())
        else:
            records = csv.DictReader(handle)
        for record in records:
            if limit is not None and len(rows) >= limit:
                break
            rows.append(request_from_row(record))
    return normalize(rows)


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

    Multiplies the request rate while keeping the per-minute shape (bursts and lulls) of the original.
    """
    if factor <= 1 or not requests:
        return list(requests)
    span = requests[-1].arrival + 1e-6
    rng = random.Random(seed)
    out = list(requests)
    for _ in range(factor - 1):
        offset = rng.uniform(0.0, jitter_s)
        out.extend(replace(r, arrival=(r.arrival + offset) % span) for r in requests)
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
