"""Real vLLM PD: the latency our router adds over the same two-stage calls made directly, and NIXL transfer time.

One prefill (kv_producer) and one decode (kv_consumer) real vLLM engine (CPU build, tiny Llama; KV over NIXL with UCX
on TCP, each engine on a loopback address of its own), and `pdfleet router` in front of them. Every request is a
streamed completion of a fresh random token-id prompt (no prefix-cache hits) with `ignore_eos`, made in one of two
ways, alternating which goes first so machine noise hits both alike:

- direct: the bench does what `pdfleet.router.handshake` does: the prefill with max_tokens=1 and kv_transfer_params,
  then the decode, streamed, with the kv_transfer_params the prefill returned;
- routed: the same request to the router, which does those two calls itself.

Printed: p50/p99 TTFT (request sent to first streamed token) and inter-token latency for both, the router's added
latency, and the decode's own `vllm:nixl_xfer_time_seconds` over the measured requests (count, mean, p50/p99
estimated from its buckets). Every engine and the router are stopped on the way out (the end, an error, Ctrl-C,
SIGTERM or SIGHUP), each vLLM engine with its whole process group.

    flock /tmp/pdfleet-real-vllm.lock .venv/bin/python bench/vllm_pd_bench.py [--requests 30] [--prompt-tokens 256]
        [--output-tokens 32]
    .venv/bin/python bench/vllm_pd_bench.py --emulator --requests 5      (a smoke run on the engine emulator)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "operator"))

import httpx  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from pdfleet.loadgen.replay import percentile  # noqa: E402
from pdfleet.localfleet import real_vllm  # noqa: E402
from pdfleet.localfleet.processes import interrupts_deferred, termination_as_interrupt  # noqa: E402
from pdfleet.router import handshake  # noqa: E402
from pdfleet.testing.engine_process import EngineProcess, free_loopback_host, start_engine  # noqa: E402
from pdfleet.testing.router_process import RouterProcess  # noqa: E402

NIXL_XFER_TIME = "vllm:nixl_xfer_time_seconds"
WARMUP_REQUESTS = 2  # per path, not measured: first-request compilation, connection set-up, NIXL handshake
REQUEST_TIMEOUT_S = 120.0
METRICS_SETTLE_S = 30.0  # vLLM publishes connector stats with a later engine-core output, not at once
FIRST_TOKEN_ID = 4  # ids 0-3 are the tiny tokenizer's special tokens
SEED = 1234
EMULATOR_VOCAB = 512  # the emulator takes any token id; the tiny model need not be installed for a smoke run
# a CPU engine's API server shares the cores with its engine and the bench: a slow /health or connect must not take
# the only decode out of the router's view mid-run (the router's defaults are 2 s)
ROUTER_ARGS = ("--shutdown-grace", "1", "--health-timeout", "10", "--connect-timeout", "10")
MAX_ERROR_SHARE = 0.1  # more failed requests than this fails the run
JSON = {"Content-Type": "application/json"}
MAX_MODEL_LEN = int(real_vllm.CPU_ENGINE_ARGS[real_vllm.CPU_ENGINE_ARGS.index("--max-model-len") + 1])


@dataclass
class Timings:
    """TTFT of each request and every inter-token gap of every request, in seconds; tokens each request streamed."""

    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def add(self, sent: float, chunks: list[tuple[float, int]]) -> None:
        """One request: (arrival time, tokens carried) of each streamed chunk."""
        self.tokens.append(sum(count for _, count in chunks))
        self.ttft_s.append(chunks[0][0] - sent)
        # a chunk of k tokens (the API server coalesces tokens when it lags its engine) counts k gaps of its gap / k
        for (before, _), (arrived, count) in zip(chunks, chunks[1:]):
            self.itl_s.extend([(arrived - before) / count] * count)

    def figures(self) -> list[float | None]:
        """[TTFT p50, TTFT p99, ITL p50, ITL p99], seconds."""
        return [percentile(values, q) for values in (self.ttft_s, self.itl_s) for q in (50, 99)]


def bucket_quantile(cumulative: Sequence[tuple[float, float]], q: float) -> float | None:
    """q-quantile (0 < q <= 1) of a histogram given as (upper bound, cumulative count) sorted by bound, +Inf last,
    estimated as Prometheus' histogram_quantile does: linear inside the bucket that holds the rank, the first bucket
    starting at 0, a rank in the +Inf bucket answered with the highest finite bound. None when it counted nothing."""
    if not 0 < q <= 1:
        raise ValueError(f"q must be in (0, 1], got {q}")
    total = cumulative[-1][1] if cumulative else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in cumulative:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


@dataclass(frozen=True)
class Histogram:
    """One scrape of a histogram summed over its series: cumulative buckets, count and sum."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float

    def minus(self, earlier: Histogram) -> Histogram:
        """What was observed between `earlier` and this scrape."""
        before = dict(earlier.buckets)
        buckets = tuple((bound, count - before.get(bound, 0.0)) for bound, count in self.buckets)
        return Histogram(buckets, self.count - earlier.count, self.sum - earlier.sum)


def scrape_histogram(url: str, name: str) -> Histogram:
    """Histogram `name` from `url`/metrics, summed over its label sets (zero when it is not exported)."""
    buckets: dict[float, float] = {}
    count = total = 0.0
    text = httpx.get(url + "/metrics", timeout=10.0, trust_env=False).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name + "_bucket":
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
            elif sample.name == name + "_count":
                count += sample.value
            elif sample.name == name + "_sum":
                total += sample.value
    return Histogram(tuple(sorted(buckets.items())), count, total)


def token_chunks(response: httpx.Response) -> list[tuple[float, int]]:
    """(arrival time, tokens carried) of every streamed chunk with a choice, until [DONE]; a chunk without
    `token_ids` (an engine that ignores return_token_ids) counts as one token."""
    chunks = []
    for line in response.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        choices = json.loads(line[len("data: ") :]).get("choices")
        if choices:
            chunks.append((time.perf_counter(), len(choices[0].get("token_ids") or ()) or 1))
    return chunks


def streamed(client: httpx.Client, url: str, body: bytes) -> list[tuple[float, int]]:
    """POST a streamed completion; its token_chunks."""
    with client.stream("POST", url + "/v1/completions", content=body, headers=JSON) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {response.status_code}: {response.read()[:500]!r}")
        return token_chunks(response)


def direct_two_stage(client: httpx.Client, prefill: str, decode: str, body: dict, raw: bytes) -> tuple[float, list]:
    """The router's two-stage handshake made by the bench: (time sent, its token_chunks)."""
    sent = time.perf_counter()
    stage1 = client.post(prefill + "/v1/completions", content=handshake.prefill_request_body(body), headers=JSON)
    kv_json = handshake.kv_transfer_params_json(stage1.content) if stage1.status_code == 200 else None
    if kv_json is None:
        raise RuntimeError(f"prefill: HTTP {stage1.status_code} without kv_transfer_params: {stage1.text[:500]}")
    return sent, streamed(client, decode, handshake.decode_request_body(raw, body, kv_json))


def routed(client: httpx.Client, router: str, raw: bytes) -> tuple[float, list]:
    """The same request through the router: (time sent, its token_chunks)."""
    sent = time.perf_counter()
    return sent, streamed(client, router, raw)


def request_body(rng: random.Random, vocab: int, model: str, prompt_tokens: int, output_tokens: int) -> dict:
    return {
        "model": model,
        "prompt": [rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(prompt_tokens)],
        "max_tokens": output_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "return_token_ids": True,
    }


def start_engines(emulator: bool) -> tuple[EngineProcess, EngineProcess]:
    """A prefill and a decode, each on a loopback address of its own; real vLLM pins one to each core."""
    if emulator:
        model = real_vllm.SERVED_MODEL_NAME
        prefill = start_engine("prefill", host=free_loopback_host(), model=model, served_model_name=model)
        try:
            decode = start_engine(
                "decode", host=free_loopback_host(taken=[prefill.host]), model=model, served_model_name=model
            )
        except BaseException:
            prefill.stop()
            raise
        return prefill, decode
    if why := real_vllm.missing():
        raise SystemExit(f"vllm_pd_bench: {why}")
    from pdfleet.testing.vllm_process import start_vllm_pair

    return start_vllm_pair(
        prefill_env={"VLLM_CPU_OMP_THREADS_BIND": "0"}, decode_env={"VLLM_CPU_OMP_THREADS_BIND": "1"}
    )


def fleet(prefill: EngineProcess, decode: EngineProcess) -> dict:
    """A router fleet view of the pair that sends every prompt through the two-stage path."""
    endpoints = [
        {"name": f"bench-{e.role}-0", "pool": e.role, "url": e.url, "rack": "rack-a", "zone": "z1"}
        for e in (prefill, decode)
    ]
    return {
        "version": 1,
        "generation": 1,
        "model": real_vllm.SERVED_MODEL_NAME,
        "endpoints": endpoints,
        "policy": {
            "disaggregateMinPromptTokens": 0,
            "maxPrefillRetries": 0,
            "maxDecodeRetries": 0,
            # the bench's own direct calls wait this long too: a stall must not fail only the routed path
            "firstByteTimeoutSeconds": REQUEST_TIMEOUT_S,
            "interChunkTimeoutSeconds": REQUEST_TIMEOUT_S,
        },
    }


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:8.1f}"


def run(args: argparse.Namespace) -> int:
    rng = random.Random(SEED)
    vocab = EMULATOR_VOCAB if args.emulator else real_vllm.tiny_model_vocab_size()
    engines: list[EngineProcess] = []
    router: RouterProcess | None = None
    try:
        with termination_as_interrupt():
            started = time.monotonic()
            engines.extend(start_engines(args.emulator))
            prefill, decode = engines
            router = RouterProcess(fleet(prefill, decode), ROUTER_ARGS)
            print(f"engines and router up in {time.monotonic() - started:.0f} s", flush=True)
            paths = {"direct": Timings(), "routed": Timings()}
            with httpx.Client(timeout=REQUEST_TIMEOUT_S, trust_env=False) as client:

                def one(path: str) -> tuple[float, list]:
                    body = request_body(rng, vocab, real_vllm.SERVED_MODEL_NAME, args.prompt_tokens, args.output_tokens)
                    raw = json.dumps(body).encode()
                    if path == "direct":
                        return direct_two_stage(client, prefill.url, decode.url, body, raw)
                    return routed(client, router.url, raw)

                for _ in range(WARMUP_REQUESTS):
                    one("direct")
                    one("routed")
                before = scrape_histogram(decode.url, NIXL_XFER_TIME)
                for i in range(args.requests):
                    for path in ("direct", "routed") if i % 2 == 0 else ("routed", "direct"):
                        try:
                            sent, chunks = one(path)
                            if len(chunks) < 2:
                                raise RuntimeError(f"{len(chunks)} chunks streamed, {args.output_tokens} tokens asked")
                            paths[path].add(sent, chunks)
                        except (RuntimeError, httpx.HTTPError) as exc:
                            paths[path].errors.append(f"{type(exc).__name__}: {exc}")
            expected = 2 * args.requests  # one transfer per request on both paths
            deadline = time.monotonic() + METRICS_SETTLE_S
            while (nixl := scrape_histogram(decode.url, NIXL_XFER_TIME).minus(before)).count < expected:
                if time.monotonic() > deadline:
                    break
                time.sleep(1.0)
            report(args, paths, nixl, expected, time.monotonic() - started)
            errors = sum(len(timings.errors) for timings in paths.values())
            return 1 if errors > MAX_ERROR_SHARE * 2 * args.requests else 0
    finally:
        with interrupts_deferred():
            router_log = router.stop() if router else ""
            for engine in engines:
                engine.stop()
            print("stopped the router and every engine it started", flush=True)
            if sys.exc_info()[0] is not None and router_log:
                print(f"router log tail:\n{router_log[-3000:]}", file=sys.stderr)


def report(args: argparse.Namespace, paths: dict[str, Timings], nixl: Histogram, expected: int, wall: float) -> None:
    engine = "engine emulator" if args.emulator else "real vLLM (CPU, tiny Llama), NIXL over UCX/TCP on loopback"
    print(
        f"\n{engine}: {args.requests} requests per path, {args.prompt_tokens} prompt tokens, "
        f"{args.output_tokens} output tokens, one at a time ({wall:.0f} s in all)"
    )
    print(f"{'':24}{'TTFT p50':>9}{'TTFT p99':>9}{'ITL p50':>9}{'ITL p99':>9}  (ms)")
    direct, routed_ = paths["direct"].figures(), paths["routed"].figures()
    print(f"{'direct two-stage calls':24}" + "".join(f" {ms(v)}" for v in direct))
    print(f"{'through the router':24}" + "".join(f" {ms(v)}" for v in routed_))
    added = [None if r is None or d is None else r - d for r, d in zip(routed_, direct)]
    print(f"{'router adds':24}" + "".join(f" {ms(v)}" for v in added))
    tokens = sorted({n for timings in paths.values() for n in timings.tokens})
    print(f"tokens streamed per request: {', '.join(map(str, tokens))}")
    for path, timings in paths.items():
        if timings.errors:
            print(f"{path}: {len(timings.errors)} failed requests (not measured), first: {timings.errors[0][:300]}")
    mean = nixl.sum / nixl.count if nixl.count else None
    p50, p99 = (bucket_quantile(nixl.buckets, q) for q in (0.5, 0.99))
    print(
        f"\nNIXL transfers on the decode ({NIXL_XFER_TIME}, measured requests only): count {nixl.count:g} "
        f"(expected {expected}), mean {ms(mean).strip()} ms, p50 {ms(p50).strip()} ms, p99 {ms(p99).strip()} ms "
        "(p50/p99 estimated from its buckets, as histogram_quantile does)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Real vLLM PD: the router's added TTFT and inter-token latency over direct two-stage calls, and "
        "NIXL transfer time as vLLM reports it. Run it under `flock /tmp/pdfleet-real-vllm.lock`.",
    )
    parser.add_argument(
        "--requests", type=int, default=30, help="measured requests per path (direct and routed alike; default 30)"
    )
    parser.add_argument(
        "--prompt-tokens", type=int, default=256, help="prompt length in tokens, random token ids (default 256)"
    )
    parser.add_argument(
        "--output-tokens", type=int, default=32, help="tokens generated per request, ignore_eos (default 32)"
    )
    parser.add_argument("--emulator", action="store_true", help="run on the engine emulator (a smoke test)")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.prompt_tokens < 1 or args.output_tokens < 2:
        parser.error("--requests and --prompt-tokens must be >= 1 and --output-tokens >= 2")
    if args.prompt_tokens + args.output_tokens > MAX_MODEL_LEN:
        parser.error(f"--prompt-tokens + --output-tokens must fit the engines' --max-model-len {MAX_MODEL_LEN}")
    try:
        return run(args)
    except KeyboardInterrupt:
        print("vllm_pd_bench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
