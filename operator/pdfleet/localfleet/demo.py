"""`pdfleet demo`: the whole loop on this machine, with autoscaling you can watch.

Starts a `LocalFleet` (control plane, 2 racks of emulated L4 GPU nodes, operator, Prometheus, pod runner), applies the
embedded PDDeployment below with autoscaling on for both pools (with `--engine vllm`: one rack, real vLLM engines
running a tiny Llama on the CPU, one prefill and one decode), replays a load that rises and falls, and shows a live
terminal view every second: pools, ready replicas per rack, TTFT and TPOT p90 (client side, last 15 s) against the SLA,
the latest scaling events. At the end it writes `demo.png` (load, replicas per pool, latency over time), `summary.txt`
and `timeline.json` into the output folder (default ./demo-out). Ctrl-C stops it cleanly at any point.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from pdfleet.loadgen.replay import (
    VOCAB_SIZE,
    RequestResult,
    Sla,
    arrivals_per_second,
    format_summary,
    percentile,
    replay,
    summarize,
    synthetic_trace,
)
from pdfleet.localfleet import real_vllm
from pdfleet.localfleet.controlplane import MissingBinariesError
from pdfleet.localfleet.harness import LocalFleet
from pdfleet.localfleet.podrunner import ENGINES
from pdfleet.sim.trace import TraceRequest
from pdfleet.sim.workload import LoadProfile

NAMESPACE = "default"
NAME = "demo"
SLA = Sla(ttft_ms=1000.0, tpot_ms=100.0)
LATENCY_WINDOW_S = 15.0
EVENT_LINES = 5


def demo_pdd(
    prometheus_url: str,
    *,
    name: str = NAME,
    namespace: str = NAMESPACE,
    max_replicas: int = 4,
    interval_s: int = 5,
    window_s: int = 20,
    scale_down_s: int = 30,
) -> dict[str, Any]:
    """The demo PDDeployment: Llama-3.1-8B on L4 nodes, 1+1 replicas to start, both pools autoscaled quickly.

    `--max-num-seqs 16` (a real vLLM flag) caps each decode batch, so decode queues, and scales, at demo rates.
    """

    def pool() -> dict[str, Any]:
        return {
            "replicas": 1,
            "gpusPerReplica": 1,
            "gpuProduct": "NVIDIA-L4",
            "autoscaling": {
                "enabled": True,
                "minReplicas": 1,
                "maxReplicas": max_replicas,
                "scaleDownStabilizationSeconds": scale_down_s,
                "maxScaleDownStep": 1,
            },
        }

    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "servedModelName": "llama-8b"},
            "engine": {"kind": "vllm", "image": "vllm/vllm-openai:v0.32.0", "args": ["--max-num-seqs", "16"]},
            "kvTransfer": {"connector": "nixl"},
            "prefill": pool(),
            "decode": pool(),
            "sla": {"ttftMs": int(SLA.ttft_ms), "tpotMs": int(SLA.tpot_ms), "percentile": 90},
            "autoscaler": {"intervalSeconds": interval_s, "windowSeconds": window_s, "drainTimeoutSeconds": 30},
            "prometheus": {"url": prometheus_url},
        },
    }


def real_vllm_pdd(prometheus_url: str, *, name: str = NAME, namespace: str = NAMESPACE) -> dict[str, Any]:
    """The demo fleet on real vLLM: the tiny Llama, one prefill and one decode (two engines are what this machine
    runs), every prompt disaggregated so each request moves its KV cache over NIXL."""
    pool = {"replicas": 1, "gpusPerReplica": 1, "gpuProduct": "NVIDIA-L4"}
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            **real_vllm.pdd_spec_fields(),
            "prefill": dict(pool),
            "decode": dict(pool),
            "router": {"policy": {"disaggregateMinPromptTokens": 0}},
            "sla": {"ttftMs": int(SLA.ttft_ms), "tpotMs": int(SLA.tpot_ms), "percentile": 90},
            "prometheus": {"url": prometheus_url},
        },
    }


def demo_trace(
    duration_s: float, base_rps: float, peak_rps: float, seed: int = 0, prompt_median: int = 600
) -> list[TraceRequest]:
    """Load that rises from `base_rps` to `peak_rps` at half time and falls back (a diurnal cycle, compressed)."""
    profile = LoadProfile(
        kind="diurnal",
        duration_s=duration_s,
        base_rps=base_rps,
        peak_rps=peak_rps,
        period_s=duration_s,
        prompt_median=prompt_median,
        prompt_sigma=0.4,
        prompt_max=4 * prompt_median,
        output_median=32,
        output_sigma=0.4,
        output_max=256,
    )
    return synthetic_trace(profile, seed)


@dataclass(frozen=True)
class Sample:
    """One second of the demo: load sent, replicas (ready and desired) per pool, client latency p90 in ms."""

    t: float
    sent_rps: int
    completed: int
    errors: int
    ready: dict[str, dict[str, int]]
    desired: dict[str, int]
    ttft_p90_ms: float | None
    tpot_p90_ms: float | None


class ResultLog:
    """Results as they arrive (from the replay thread), with the latency of a trailing window."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.results: list[tuple[float, RequestResult]] = []

    def add(self, result: RequestResult) -> None:
        """Record one finished request with its completion time."""
        with self._lock:
            self.results.append((time.monotonic(), result))

    def window(self, now: float, seconds: float) -> list[RequestResult]:
        """Requests that finished within the last `seconds` before `now`."""
        with self._lock:
            return [r for t, r in self.results if now - t <= seconds]

    def all(self) -> list[RequestResult]:
        """Every recorded request, oldest first."""
        with self._lock:
            return [r for _, r in self.results]


def p90_ms(results: Sequence[RequestResult], field: str) -> float | None:
    """p90 in ms of a latency field over the completed results."""
    values = [getattr(r, field) for r in results if r.ok and getattr(r, field) is not None]
    value = percentile(values, 90)
    return None if value is None else value * 1000


def _bar(fraction: float, width: int = 30) -> str:
    filled = int(round(max(0.0, min(1.0, fraction)) * width))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _vs(value: float | None, target: float) -> str:
    if value is None:
        return "   -   "
    return f"{value:6.0f} ms {'OK ' if value <= target else 'OVER'}"


def render_view(sample: Sample, duration_s: float, events: Sequence[str], racks: Sequence[str]) -> str:
    """The live terminal screen for one sample (pure)."""
    lines = [
        f"pdfleet demo  {_bar(sample.t / duration_s)} {sample.t:4.0f}/{duration_s:.0f} s   "
        f"load {sample.sent_rps:2d} req/s   done {sample.completed}   errors {sample.errors}",
        "",
    ]
    lines.append(f"{'pool':<8} {'ready':>5} {'desired':>7}   " + "  ".join(f"{rack:>8}" for rack in racks))
    for pool in ("prefill", "decode"):
        ready = sample.ready.get(pool, {})
        lines.append(
            f"{pool:<8} {sum(ready.values()):>5} {sample.desired.get(pool, 0):>7}   "
            + "  ".join(f"{ready.get(rack, 0):>8}" for rack in racks)
        )
    lines += [
        "",
        f"TTFT p90 {_vs(sample.ttft_p90_ms, SLA.ttft_ms)}  (SLA {SLA.ttft_ms:.0f} ms)",
        f"TPOT p90 {_vs(sample.tpot_p90_ms, SLA.tpot_ms)}  (SLA {SLA.tpot_ms:.0f} ms)",
        f"(client side, last {LATENCY_WINDOW_S:.0f} s)",
        "",
        "last scaling decisions:",
    ]
    lines += [f"  {line}" for line in events[-EVENT_LINES:]] or ["  (none yet)"]
    return "\n".join(lines)


def scaling_events(events: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per autoscaler event (ScaledUp, ScaledDown, Drain*), oldest first."""
    lines = []
    for event in events:
        if event.get("reason", "").startswith(("Scaled", "Drain")):
            stamp = (event.get("lastTimestamp") or event.get("eventTime") or "")[11:19]
            lines.append(f"{stamp} {event['reason']}: {event.get('message', '')}")
    return lines


def write_plot(samples: Sequence[Sample], path: Path) -> None:
    """PNG with load, replicas per pool (ready, desired dashed) and TTFT/TPOT p90 against the SLA over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    axes[0].plot(t, [s.sent_rps for s in samples], color="tab:gray", label="requests sent / s")
    axes[0].set_ylabel("load (req/s)")
    for pool, color in (("prefill", "tab:blue"), ("decode", "tab:orange")):
        axes[1].step(
            t, [sum(s.ready.get(pool, {}).values()) for s in samples], where="post", color=color, label=f"{pool} ready"
        )
        axes[1].step(
            t,
            [s.desired.get(pool, 0) for s in samples],
            where="post",
            color=color,
            linestyle="--",
            label=f"{pool} desired",
        )
    axes[1].set_ylabel("replicas")
    for axis, field, target, name in (
        (axes[2], "ttft_p90_ms", SLA.ttft_ms, "TTFT"),
        (axes[3], "tpot_p90_ms", SLA.tpot_ms, "TPOT"),
    ):
        axis.plot(t, [getattr(s, field) for s in samples], color="tab:green", label=f"{name} p90 (client)")
        axis.axhline(target, color="tab:red", linestyle=":", label=f"SLA {target:.0f} ms")
        axis.set_ylabel(f"{name} (ms)")
    axes[3].set_xlabel("time (s)")
    for axis in axes:
        axis.grid(alpha=0.3)
        axis.legend(loc="upper left", fontsize=8)
    axes[0].set_title("pdfleet demo: load, replicas and latency")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summary_text(
    samples: Sequence[Sample], replay_summary: Mapping[str, Any], events: Sequence[str], startup_s: float
) -> str:
    """The end-of-demo text summary."""
    peaks = {
        pool: max((sum(s.ready.get(pool, {}).values()) for s in samples), default=0) for pool in ("prefill", "decode")
    }
    final = samples[-1] if samples else None
    lines = [
        f"pdfleet demo summary (fleet up in {startup_s:.0f} s)",
        "",
        format_summary(dict(replay_summary)),
        "",
        f"peak ready replicas: prefill {peaks['prefill']}, decode {peaks['decode']}",
    ]
    if final is not None:
        lines.append(
            "final ready replicas: "
            + ", ".join(
                f"{pool} {sum(final.ready.get(pool, {}).values())} {dict(final.ready.get(pool, {}))}"
                for pool in ("prefill", "decode")
            )
        )
    lines += ["", f"scaling events ({len(events)}):"] + [f"  {line}" for line in events]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the demo the way Ctrl-C does (clean-up runs)."""

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pdfleet demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--duration", type=float, default=240.0, help="seconds of load (default 240)")
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="emulator",
        help="engine pods: the emulator (L4 timing, autoscaled pools) or real vLLM on the CPU (the tiny Llama, one "
        "prefill and one decode, installed by ./dev setup)",
    )
    p.add_argument("--base-rate", type=float, default=None, help="load at start and end, req/s (1; vllm: 0.1)")
    p.add_argument("--peak-rate", type=float, default=None, help="load at half time, req/s (8; vllm: 0.4)")
    p.add_argument("--racks", type=int, default=2)
    p.add_argument("--max-replicas", type=int, default=4, help="per pool")
    p.add_argument("--out", type=Path, default=Path("demo-out"), help="output folder (default ./demo-out)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plain", action="store_true", help="one status line every 5 s instead of a live screen")
    return p


def _sample(fleet: LocalFleet, t: float, sent: int, log: ResultLog) -> Sample:
    now = time.monotonic()
    results = log.all()
    recent = log.window(now, LATENCY_WINDOW_S)
    spec = fleet.get(NAMESPACE, NAME)["spec"]
    return Sample(
        t=round(t, 1),
        sent_rps=sent,
        completed=sum(r.ok for r in results),
        errors=sum(not r.ok for r in results),
        ready=fleet.ready_by_rack(NAMESPACE, NAME),
        desired={pool: spec[pool]["replicas"] for pool in ("prefill", "decode")},
        ttft_p90_ms=p90_ms(recent, "ttft_s"),
        tpot_p90_ms=p90_ms(recent, "tpot_s"),
    )


def run_demo(args: argparse.Namespace) -> int:
    """Start the fleet, run the load with the live view, write the outputs; everything stops on the way out."""
    real = args.engine == "vllm"
    racks = [f"rack-{chr(ord('a') + i)}" for i in range(1 if real else args.racks)]
    base_rate = args.base_rate if args.base_rate is not None else (0.1 if real else 1.0)
    peak_rate = args.peak_rate if args.peak_rate is not None else (0.4 if real else 8.0)
    live = sys.stdout.isatty() and not args.plain
    samples: list[Sample] = []
    events: list[str] = []
    log = ResultLog()
    stop = threading.Event()
    began = time.monotonic()
    print(
        f"starting the local fleet ({len(racks)} racks: control plane, operator, Prometheus, pod runner)...", flush=True
    )
    with LocalFleet(racks=racks, engine=args.engine) as fleet:
        startup_s = time.monotonic() - began
        assert fleet.prometheus is not None
        if real:
            pdd = real_vllm_pdd(fleet.prometheus.url)
        else:
            pdd = demo_pdd(fleet.prometheus.url, max_replicas=args.max_replicas)
        fleet.apply(pdd)
        model = pdd["spec"]["model"]["servedModelName"]
        vocab_size = real_vllm.tiny_model_vocab_size() if real else VOCAB_SIZE
        print(
            f"fleet up in {startup_s:.0f} s; PDDeployment {NAMESPACE}/{NAME} applied, waiting for it to serve...",
            flush=True,
        )
        fleet.wait_serving(NAMESPACE, NAME, timeout=420 if real else 180)  # real vLLM loads in a minute or two
        url = fleet.router_url(NAMESPACE, NAME)
        trace = demo_trace(args.duration, base_rate, peak_rate, args.seed, prompt_median=100 if real else 600)
        sent_per_second = arrivals_per_second(trace, int(args.duration) + 1)
        print(f"serving at {url}; replaying {len(trace)} requests over {args.duration:.0f} s", flush=True)
        worker = threading.Thread(
            target=lambda: asyncio.run(
                replay(
                    url,
                    trace,
                    model=model,
                    vocab_size=vocab_size,
                    request_timeout_s=60.0,
                    on_result=log.add,
                    stop=stop,
                )
            ),
            name="replay",
            daemon=True,
        )
        load_start = time.monotonic()
        worker.start()
        try:
            while worker.is_alive() and (elapsed := time.monotonic() - load_start) < args.duration + 70:
                second = min(int(elapsed), len(sent_per_second) - 1)
                sample = _sample(fleet, elapsed, sent_per_second[second] if elapsed < args.duration else 0, log)
                samples.append(sample)
                if len(samples) % 2 == 1:
                    events = scaling_events(fleet.events(NAMESPACE, NAME))
                if live:
                    print("\x1b[H\x1b[2J" + render_view(sample, args.duration, events, racks), flush=True)
                elif len(samples) % 5 == 1:
                    ready = {p: sum(v.values()) for p, v in sample.ready.items()}
                    print(
                        f"t={sample.t:5.0f}s load={sample.sent_rps:2d}/s ready={ready} desired={sample.desired} "
                        f"ttft_p90={sample.ttft_p90_ms or 0:.0f}ms tpot_p90={sample.tpot_p90_ms or 0:.0f}ms "
                        f"errors={sample.errors}",
                        flush=True,
                    )
                time.sleep(max(0.0, 1.0 - (time.monotonic() - load_start - elapsed)))
        finally:
            stop.set()
            worker.join(timeout=15)
            events = scaling_events(fleet.events(NAMESPACE, NAME)) if fleet.api is not None else events
            _write_outputs(args.out, samples, log.all(), events, startup_s, time.monotonic() - load_start)
    return 0


def _write_outputs(
    out: Path,
    samples: Sequence[Sample],
    results: Sequence[RequestResult],
    events: Sequence[str],
    startup_s: float,
    duration_s: float,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    replay_summary = summarize(results, SLA, duration_s)
    (out / "timeline.json").write_text(
        json.dumps(
            {"samples": [asdict(s) for s in samples], "replay": replay_summary, "events": list(events)}, indent=1
        )
    )
    text = summary_text(samples, replay_summary, events, startup_s)
    (out / "summary.txt").write_text(text)
    if samples:
        write_plot(samples, out / "demo.png")
    print("\n" + text + f"\nwrote {out / 'demo.png'}, {out / 'summary.txt'}, {out / 'timeline.json'}", flush=True)


def main(argv: list[str]) -> int:
    """Entry point of `pdfleet demo`."""
    args = _parser().parse_args(argv)
    try:
        with _sigterm_as_interrupt():
            return run_demo(args)
    except (MissingBinariesError, FileNotFoundError, RuntimeError) as error:
        print(f"pdfleet demo: {error}\n(`./dev setup` installs everything the demo needs)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: the fleet has been stopped, no process left behind", file=sys.stderr)
        return 130
