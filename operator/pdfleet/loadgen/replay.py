"""Load replay: send a request trace to a router with real timing, open loop, and report latency and SLA attainment.

`pdfleet replay --url http://127.1.0.5:8080 --profile burst --duration 120 --rate 2 --peak-rate 8`

Each request is a streaming `/v1/completions` call whose prompt is a list of token ids of the trace's length (shared
prefix blocks become identical leading ids, so the router's prefix affinity sees them) with `max_tokens` = the trace's
output length and `ignore_eos`, so the engine produces exactly that many tokens. Arrivals are open loop: each request
starts at its trace time whether or not earlier ones have answered; the number in flight is capped (`max_inflight`;
an arrival over the cap is recorded as an error, never delayed), and every request has a timeout, so a run is bounded.

Measured per request, on the client: TTFT (send -> first token), TPOT (mean gap between the following tokens), whether
it completed. Synthetic profiles come from `pdfleet.sim.workload`; trace files are read by `pdfleet.sim.trace`
(Azure LLM inference CSV, or the generic CSV/JSONL form).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pdfleet.cli.argtypes import (
    CommandParser,
    fraction,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from pdfleet.sim.trace import TIME_UNITS, TraceRequest, add_shared_prefixes, read_trace
from pdfleet.sim.workload import PROFILE_KINDS, LoadProfile, generate

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_TRACE = REPO_ROOT.parent / "shared" / "traces" / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
VOCAB_SIZE = 32000
DEFAULT_MAX_REQUESTS = 20000
LOOPBACK_HOSTS = ("localhost",)


@dataclass(frozen=True)
class Sla:
    """Latency objectives a request must meet to count as attained."""

    ttft_ms: float = 500.0
    tpot_ms: float = 50.0


@dataclass(frozen=True)
class RequestResult:
    """What the client saw of one request. Times in seconds; `start_s` is from the replay's start."""

    index: int
    start_s: float
    prompt_tokens: int
    output_tokens: int
    tokens_received: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None
    latency_s: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the request completed without an error."""
        return self.error is None


# --- pure: prompts, bodies, statistics -----------------------------------------------------------------------------


def prompt_token_ids(request: TraceRequest, index: int, block_tokens: int, vocab_size: int = VOCAB_SIZE) -> list[int]:
    """Token ids of the request's prompt: its shared prefix blocks first (same block id, same ids), then unique ids;
    every id in [1, vocab_size), since a real engine rejects ids outside its model's vocabulary."""
    ids: list[int] = []
    for block in request.prefix_blocks:
        ids.extend((block * 7919 + k * 104729) % (vocab_size - 1) + 1 for k in range(block_tokens))
    ids = ids[: request.prompt_tokens]
    seed = index * 2654435761
    ids.extend((seed + k * 40503) % (vocab_size - 1) + 1 for k in range(request.prompt_tokens - len(ids)))
    return ids


def completion_body(
    model: str, request: TraceRequest, index: int, block_tokens: int, vocab_size: int = VOCAB_SIZE
) -> dict[str, Any]:
    """The streaming /v1/completions request body for one trace request."""
    return {
        "model": model,
        "prompt": prompt_token_ids(request, index, block_tokens, vocab_size),
        "max_tokens": request.output_tokens,
        "min_tokens": request.output_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},  # a lagging engine packs tokens into one chunk: count by usage
        "temperature": 0.0,
    }


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _ms_percentiles(values: Sequence[float]) -> dict[str, float | None]:
    return {f"p{q}": (None if (v := percentile(values, q)) is None else round(v * 1000, 1)) for q in (50, 90, 99)}


def meets_sla(result: RequestResult, sla: Sla) -> tuple[bool, bool]:
    """(TTFT met, TPOT met) for a completed request; a request of one token has no TPOT and meets it."""
    if not result.ok or result.ttft_s is None:
        return False, False
    return result.ttft_s * 1000 <= sla.ttft_ms, result.tpot_s is None or result.tpot_s * 1000 <= sla.tpot_ms


def summarize(results: Sequence[RequestResult], sla: Sla, duration_s: float) -> dict[str, Any]:
    """Counts, TTFT/TPOT p50/p90/p99 (ms, completed requests), SLA attainment (fraction of all requests), errors."""
    done = [r for r in results if r.ok]
    attained = [meets_sla(r, sla) for r in results]
    total = len(results) or 1
    return {
        "requests": len(results),
        "completed": len(done),
        "errors": len(results) - len(done),
        "error_kinds": dict(Counter(r.error.split(":")[0] for r in results if r.error)),
        "duration_s": round(duration_s, 1),
        "throughput_rps": round(len(done) / duration_s, 2) if duration_s > 0 else 0.0,
        "output_tokens_per_s": round(sum(r.tokens_received for r in done) / duration_s, 1) if duration_s > 0 else 0,
        "ttft_ms": _ms_percentiles([r.ttft_s for r in done if r.ttft_s is not None]),
        "tpot_ms": _ms_percentiles([r.tpot_s for r in done if r.tpot_s is not None]),
        "sla": asdict(sla),
        "sla_attainment": {
            "ttft": round(sum(t for t, _ in attained) / total, 4),
            "tpot": round(sum(p for _, p in attained) / total, 4),
            "both": round(sum(t and p for t, p in attained) / total, 4),
        },
    }


def format_summary(summary: dict[str, Any]) -> str:
    """A few human lines for a summary from `summarize`."""

    def row(name: str) -> str:
        values = summary[name]
        return " ".join(f"{k}={'-' if v is None else f'{v:.0f}'}" for k, v in values.items())

    sla, att = summary["sla"], summary["sla_attainment"]
    lines = [
        f"requests {summary['requests']}  completed {summary['completed']}  errors {summary['errors']}"
        + (f" {summary['error_kinds']}" if summary["error_kinds"] else ""),
        f"throughput {summary['throughput_rps']} req/s, {summary['output_tokens_per_s']} output tokens/s "
        f"over {summary['duration_s']} s",
        f"TTFT ms {row('ttft_ms')}   (SLA {sla['ttft_ms']:g} ms: {att['ttft']:.1%} attained)",
        f"TPOT ms {row('tpot_ms')}   (SLA {sla['tpot_ms']:g} ms: {att['tpot']:.1%} attained)",
        f"SLA attainment (both): {att['both']:.1%}",
    ]
    return "\n".join(lines)


def synthetic_trace(
    profile: LoadProfile,
    seed: int = 0,
    prefix_groups: int = 0,
    prefix_tokens: int = 512,
    prefix_share: float = 0.5,
    block_tokens: int = 64,
) -> list[TraceRequest]:
    """A synthetic trace from a load profile, optionally with shared system-prompt prefixes (add_shared_prefixes)."""
    requests = generate(profile, seed)
    if prefix_groups > 0:
        requests = add_shared_prefixes(requests, prefix_groups, prefix_tokens, prefix_share, block_tokens, seed)
    return requests


def window_trace(
    requests: Sequence[TraceRequest], speed: float, duration_s: float | None, max_requests: int
) -> list[TraceRequest]:
    """Replay a recorded trace `speed` times faster, keep what arrives within `duration_s`, at most `max_requests`."""
    out = []
    for request in requests:
        arrival = request.arrival / speed
        if (duration_s is not None and arrival >= duration_s) or len(out) >= max_requests:
            break
        out.append(replace(request, arrival=arrival))
    return out


def arrivals_per_second(requests: Sequence[TraceRequest], seconds: int) -> list[int]:
    """How many requests the trace starts in each second [0, seconds)."""
    counts = [0] * max(seconds, 0)
    for request in requests:
        slot = int(request.arrival)
        if 0 <= slot < len(counts):
            counts[slot] += 1
    return counts


def is_loopback(url: str) -> bool:
    """True when the URL's host is a loopback address (127/8, ::1, localhost)."""
    host = urlsplit(url).hostname or ""
    return host in LOOPBACK_HOSTS or host == "::1" or host.startswith("127.")


# --- the adapter: one open-loop replay over HTTP ------------------------------------------------------------------


class _Stream:
    """Tracks one streaming reply: when tokens arrive and whether the stream finished cleanly."""

    def __init__(self, sent: float) -> None:
        self.sent = sent
        self.first: float | None = None
        self.last: float | None = None
        self.chunks = 0  # chunks that carried text
        self.usage_tokens: int | None = None  # completion_tokens of the final usage chunk
        self.done = False

    @property
    def tokens(self) -> int:
        """Tokens received: the engine's own count when it sent usage, else the text chunks."""
        return self.chunks if self.usage_tokens is None else self.usage_tokens

    def feed(self, line: bytes, now: float) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        chunk = json.loads(payload)
        if "error" in chunk:
            raise RuntimeError(f"stream error: {chunk['error'].get('message', chunk['error'])}")
        usage = chunk.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            self.usage_tokens = int(usage["completion_tokens"])
        choices = chunk.get("choices") or []
        if choices and (choices[0].get("text") or (choices[0].get("delta") or {}).get("content")):
            self.chunks += 1
            self.first = self.first if self.first is not None else now
            self.last = now


async def _send(
    session: Any, url: str, body: dict[str, Any], index: int, request: TraceRequest, start: float
) -> RequestResult:
    import aiohttp

    sent = time.monotonic()
    base = RequestResult(
        index=index, start_s=sent - start, prompt_tokens=request.prompt_tokens, output_tokens=request.output_tokens
    )
    stream = _Stream(sent)
    try:
        async with session.post(url, json=body, headers={"X-Request-Id": f"replay-{index}"}) as reply:
            if reply.status != 200:
                text = (await reply.text())[:200]
                return replace(base, error=f"http {reply.status}: {text}")
            async for line in reply.content:
                stream.feed(line, time.monotonic())
    except asyncio.TimeoutError:
        return replace(base, tokens_received=stream.tokens, error="timeout: no complete reply in time")
    except (aiohttp.ClientError, OSError, RuntimeError, ValueError) as error:
        return replace(base, tokens_received=stream.tokens, error=f"{type(error).__name__}: {error}")
    end = time.monotonic()
    if not stream.done or stream.tokens < request.output_tokens:
        return replace(
            base,
            tokens_received=stream.tokens,
            error=f"incomplete: {stream.tokens}/{request.output_tokens} tokens, done={stream.done}",
        )
    tpot = ((stream.last - stream.first) / (stream.tokens - 1)) if stream.tokens > 1 else None
    return replace(base, tokens_received=stream.tokens, ttft_s=stream.first - sent, tpot_s=tpot, latency_s=end - sent)


async def replay(
    url: str,
    requests: Sequence[TraceRequest],
    *,
    model: str,
    block_tokens: int = 64,
    vocab_size: int = VOCAB_SIZE,
    request_timeout_s: float = 120.0,
    max_inflight: int = 512,
    on_result: Callable[[RequestResult], None] | None = None,
    stop: threading.Event | None = None,
) -> list[RequestResult]:
    """Send `requests` to `url` (a router base URL) at their arrival times; return every result, in index order.

    Ends when every request has answered or timed out; `stop` (set from any thread) ends it early, recording
    requests still in flight as `cancelled` and those not yet sent not at all.
    """
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=5)
    connector = aiohttp.TCPConnector(limit=0)
    endpoint = url.rstrip("/") + "/v1/completions"
    results: dict[int, RequestResult] = {}
    tasks: dict[int, asyncio.Task[RequestResult]] = {}

    def record(result: RequestResult) -> None:
        results[result.index] = result
        if on_result is not None:
            on_result(result)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False) as session:
        start = time.monotonic()
        for index, request in enumerate(requests):
            while (delay := start + request.arrival - time.monotonic()) > 0:
                if stop is not None and stop.is_set():
                    break
                await asyncio.sleep(min(delay, 0.2))
            if stop is not None and stop.is_set():
                break
            if len(tasks) >= max_inflight:
                record(
                    RequestResult(
                        index,
                        time.monotonic() - start,
                        request.prompt_tokens,
                        request.output_tokens,
                        error=f"overload: {max_inflight} requests already in flight",
                    )
                )
                continue
            body = completion_body(model, request, index, block_tokens, vocab_size)
            task = asyncio.create_task(_send(session, endpoint, body, index, request, start))
            tasks[index] = task
            task.add_done_callback(lambda t, i=index: (tasks.pop(i, None), t.cancelled() or record(t.result())))
        while tasks and not (stop is not None and stop.is_set()):
            await asyncio.wait(list(tasks.values()), timeout=0.2)
        for index, task in list(tasks.items()):
            task.cancel()
            request = requests[index]
            record(RequestResult(index, 0.0, request.prompt_tokens, request.output_tokens, error="cancelled"))
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    return [results[i] for i in sorted(results)]


def served_model(url: str, timeout_s: float = 5.0) -> str:
    """The first model id the router serves (GET /v1/models)."""
    import httpx

    reply = httpx.get(url.rstrip("/") + "/v1/models", timeout=timeout_s, trust_env=False)
    reply.raise_for_status()
    return reply.json()["data"][0]["id"]


# --- command line ----------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="pdfleet replay", description=__doc__)
    p.add_argument("--url", required=True, help="router base URL, e.g. http://127.1.0.5:8080")
    p.add_argument("--profile", choices=(*PROFILE_KINDS, "trace"), default="steady", help="load shape, or a trace file")
    p.add_argument(
        "--trace",
        type=Path,
        default=DEFAULT_TRACE,
        help="trace file for --profile trace (Azure CSV or generic CSV/JSONL); synthetic if absent",
    )
    p.add_argument(
        "--time-unit",
        choices=tuple(TIME_UNITS),
        help="unit of the trace's numeric arrival column where its format does not fix it (Mooncake JSONL: ms)",
    )
    p.add_argument(
        "--duration", type=positive_float, default=60.0, help="seconds of load (trace: keep this much of it)"
    )
    p.add_argument("--rate", type=positive_float, default=2.0, help="base request rate, req/s")
    p.add_argument(
        "--peak-rate", type=positive_float, help="peak request rate for ramp/burst/diurnal (default 4x --rate)"
    )
    p.add_argument("--period", type=positive_float, help="burst/diurnal period, s (default: --duration)")
    p.add_argument("--burst-seconds", type=positive_float, default=20.0, help="burst length, s")
    p.add_argument("--prompt-tokens", type=positive_int, default=600, help="median prompt length (synthetic)")
    p.add_argument("--output-tokens", type=positive_int, default=32, help="median output length (synthetic)")
    p.add_argument(
        "--length-sigma", type=non_negative_float, default=0.4, help="log-normal sigma of both lengths (synthetic)"
    )
    p.add_argument("--speed", type=positive_float, default=1.0, help="replay a trace file this many times faster")
    p.add_argument("--max-requests", type=positive_int, default=DEFAULT_MAX_REQUESTS, help="send at most this many")
    p.add_argument(
        "--prefix-groups", type=non_negative_int, default=0, help="shared system prompts (synthetic; 0 = none)"
    )
    p.add_argument("--prefix-tokens", type=positive_int, default=512, help="length of each shared prompt (synthetic)")
    p.add_argument(
        "--prefix-share", type=fraction, default=0.5, help="share of requests with a shared prompt (synthetic)"
    )
    p.add_argument("--block-tokens", type=positive_int, default=64, help="router prefixBlockTokens")
    p.add_argument(
        "--vocab-size",
        type=positive_int,
        default=VOCAB_SIZE,
        help="prompt token ids stay below this (the model's vocabulary)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic trace")
    p.add_argument("--model", help="model name to send (default: the router's first /v1/models entry)")
    p.add_argument("--sla-ttft-ms", type=positive_float, default=500.0, help="TTFT target the summary counts")
    p.add_argument("--sla-tpot-ms", type=positive_float, default=50.0, help="TPOT target the summary counts")
    p.add_argument("--timeout", type=positive_float, default=120.0, help="per-request timeout, s")
    p.add_argument(
        "--max-inflight", type=positive_int, default=512, help="requests in flight at most (more count as errors)"
    )
    p.add_argument("--json", type=Path, help="also write the summary and per-request results here")
    p.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --url")
    return p


def trace_from_args(args: argparse.Namespace) -> tuple[str, list[TraceRequest]]:
    """(description, requests) the command line asks for; a missing trace file falls back to synthetic."""
    if args.profile == "trace":
        if args.trace.is_file():
            requests = read_trace(args.trace, time_unit=args.time_unit, block_tokens=args.block_tokens)
            return f"trace {args.trace.name} x{args.speed:g}", window_trace(
                requests, args.speed, args.duration, args.max_requests
            )
        print(f"pdfleet replay: trace {args.trace} not found; using the synthetic diurnal profile", file=sys.stderr)
        args.profile = "diurnal"
    profile = LoadProfile(
        kind=args.profile,
        duration_s=args.duration,
        base_rps=args.rate,
        peak_rps=args.peak_rate if args.peak_rate is not None else 4 * args.rate,
        period_s=args.period or args.duration,
        burst_s=args.burst_seconds,
        prompt_median=args.prompt_tokens,
        prompt_sigma=args.length_sigma,
        output_median=args.output_tokens,
        output_sigma=args.length_sigma,
    )
    requests = synthetic_trace(
        profile, args.seed, args.prefix_groups, args.prefix_tokens, args.prefix_share, args.block_tokens
    )
    return f"synthetic {args.profile}", requests[: args.max_requests]


def main(argv: list[str]) -> int:
    """Entry point of `pdfleet replay`."""
    args = _parser().parse_args(argv)
    if not args.allow_remote and not is_loopback(args.url):
        print(f"pdfleet replay: {args.url} is not a loopback address (pass --allow-remote)", file=sys.stderr)
        return 2
    try:
        description, requests = trace_from_args(args)
    except ValueError as exc:
        print(f"pdfleet replay: {exc}", file=sys.stderr)
        return 2
    model = args.model or served_model(args.url)
    span = requests[-1].arrival if requests else 0.0
    print(f"replaying {len(requests)} requests ({description}) over {span:.0f} s to {args.url} as {model!r}")
    began = time.monotonic()
    results = asyncio.run(
        replay(
            args.url,
            requests,
            model=model,
            block_tokens=args.block_tokens,
            vocab_size=args.vocab_size,
            request_timeout_s=args.timeout,
            max_inflight=args.max_inflight,
        )
    )
    summary = summarize(results, Sla(args.sla_ttft_ms, args.sla_tpot_ms), time.monotonic() - began)
    print(format_summary(summary))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "results": [asdict(r) for r in results]}, indent=1))
    return 0 if summary["errors"] == 0 else 1
