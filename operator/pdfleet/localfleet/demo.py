"""`pdfleet demo`: the whole loop on this machine, with autoscaling you can watch.

Starts a `LocalFleet` (control plane, 2 racks of emulated L4 GPU nodes, operator, Prometheus, pod runner), applies the
embedded PDDeployment below with autoscaling on for both pools (with `--engine vllm`: one rack, real vLLM engines
running a tiny Llama on the CPU, one prefill and one decode), replays a load that rises, falls and stays low for the
last 40% of the run (so the scale-down shows too), and shows a live terminal view every second: pools, ready, desired
and max replicas per rack, TTFT and TPOT p90 (client side, last 15 s) against the SLA, the latest scaling events. At
the start it prints the fleet's kubeconfig, a `kubectl ... get pdd -w` to run alongside, and the Prometheus URL. At the
end it writes `demo.png` (load, replicas per pool with scaling steps and max, latency over time), `summary.txt` and
`timeline.json` into the output folder (default ./demo-out). Ctrl-C stops it cleanly at any point.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from pdfleet import POOLS
from pdfleet.cli.argtypes import CommandParser, positive_float, positive_int
from pdfleet.loadgen.replay import (
    VOCAB_SIZE,
    RequestResult,
    Sla,
    arrivals_per_second,
    percentile,
    replay,
    summarize,
    synthetic_trace,
)
from pdfleet.localfleet import real_vllm
from pdfleet.localfleet.controlplane import MissingBinariesError, cache_bin_dir
from pdfleet.localfleet.harness import LocalFleet
from pdfleet.localfleet.podrunner import ENGINES
from pdfleet.localfleet.processes import termination_as_interrupt
from pdfleet.sim.trace import TraceRequest
from pdfleet.sim.workload import LoadProfile

NAMESPACE = "default"
NAME = "demo"
SLA = Sla(ttft_ms=1000.0, tpot_ms=100.0)
LATENCY_WINDOW_S = 15.0
EVENT_LINES = 5
# The last 40% of the run stays at the base load: long enough (96 s of the default 240 s) for the 30 s scale-down
# stabilization and one drain per step to bring the pools back down before the end.
BASE_TAIL_FRACTION = 0.4
LOAD_SMOOTHING_S = 11  # centred moving-average window of the plotted load (5 s either side)


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
            **real_vllm.pdd_spec_fields(disaggregateMinPromptTokens=0),
            "prefill": dict(pool),
            "decode": dict(pool),
            "sla": {"ttftMs": int(SLA.ttft_ms), "tpotMs": int(SLA.tpot_ms), "percentile": 90},
            "prometheus": {"url": prometheus_url},
        },
    }


def demo_trace(
    duration_s: float, base_rps: float, peak_rps: float, seed: int = 0, prompt_median: int = 600
) -> list[TraceRequest]:
    """Load that rises from `base_rps` to `peak_rps` and falls back within the first 60% of the run (a compressed
    diurnal cycle, peak at 30%), then stays at `base_rps` for the rest (`BASE_TAIL_FRACTION`)."""
    cycle_s = duration_s * (1 - BASE_TAIL_FRACTION)
    lengths = {
        "prompt_median": prompt_median,
        "prompt_sigma": 0.4,
        "prompt_max": 4 * prompt_median,
        "output_median": 32,
        "output_sigma": 0.4,
        "output_max": 256,
    }
    cycle = LoadProfile(
        kind="diurnal", duration_s=cycle_s, base_rps=base_rps, peak_rps=peak_rps, period_s=cycle_s, **lengths
    )
    tail = LoadProfile(kind="steady", duration_s=duration_s - cycle_s, base_rps=base_rps, **lengths)
    return synthetic_trace(cycle, seed) + [
        replace(request, arrival=request.arrival + cycle_s) for request in synthetic_trace(tail, seed + 1)
    ]


def max_replicas(pdd: Mapping[str, Any]) -> dict[str, int]:
    """Each pool's upper bound: autoscaling's maxReplicas, or its fixed replicas when not autoscaled."""
    bounds = {}
    for pool in POOLS:
        spec = pdd["spec"][pool]
        autoscaling = spec.get("autoscaling") or {}
        bounds[pool] = autoscaling["maxReplicas"] if autoscaling.get("enabled") else spec["replicas"]
    return bounds


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


def render_view(
    sample: Sample,
    duration_s: float,
    events: Sequence[str],
    racks: Sequence[str],
    bounds: Mapping[str, int],
    header: Sequence[str] = (),
) -> str:
    """The live terminal screen for one sample (pure); `header` lines (where to watch from) go on top."""
    lines = [*header, ""] if header else []
    lines += [
        f"pdfleet demo  {_bar(sample.t / duration_s)} {sample.t:4.0f}/{duration_s:.0f} s   "
        f"load {sample.sent_rps:2d} req/s   done {sample.completed}   errors {sample.errors}",
        "",
    ]
    lines.append(f"{'pool':<8} {'ready':>5} {'desired':>7} {'max':>4}   " + "  ".join(f"{rack:>8}" for rack in racks))
    for pool in POOLS:
        ready = sample.ready.get(pool, {})
        lines.append(
            f"{pool:<8} {sum(ready.values()):>5} {sample.desired.get(pool, 0):>7} {bounds.get(pool, 0):>4}   "
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


def plain_line(sample: Sample, bounds: Mapping[str, int]) -> str:
    """One status line (pure), for `--plain` or a stdout that is not a terminal."""
    pools = "  ".join(
        f"{pool} {sum(sample.ready.get(pool, {}).values())}/{sample.desired.get(pool, 0)} (max {bounds.get(pool, 0)})"
        for pool in POOLS
    )
    ttft = "-" if sample.ttft_p90_ms is None else f"{sample.ttft_p90_ms:.0f} ms"
    tpot = "-" if sample.tpot_p90_ms is None else f"{sample.tpot_p90_ms:.0f} ms"
    return (
        f"t={sample.t:4.0f} s  load {sample.sent_rps:2d} req/s  ready/desired: {pools}  "
        f"TTFT p90 {ttft}  TPOT p90 {tpot}  errors {sample.errors}"
    )


def watch_lines(kubeconfig: Path, prometheus_url: str) -> list[str]:
    """Where a person can watch the fleet from another terminal while the demo runs (pure)."""
    kubectl = cache_bin_dir() / "kubectl"
    kubectl_cmd = str(kubectl) if kubectl.exists() else "kubectl"
    return [
        f"kubeconfig:  {kubeconfig}",
        f"watch:       {kubectl_cmd} --kubeconfig {kubeconfig} get pdd -w",
        f"Prometheus:  {prometheus_url}/graph?g0.expr=pdfleet_autoscaler_desired_replicas",
    ]


def scaling_events(events: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per autoscaler event (ScaledUp, ScaledDown, Drain*), oldest first."""
    lines = []
    for event in events:
        if event.get("reason", "").startswith(("Scaled", "Drain")):
            stamp = (event.get("lastTimestamp") or event.get("eventTime") or "")[11:19]
            lines.append(f"{stamp} {event['reason']}: {event.get('message', '')}")
    return lines


def scaling_steps(samples: Sequence[Sample]) -> list[tuple[float, str, int, int]]:
    """(time, pool, from, to) for every change of a pool's desired replicas between samples (pure)."""
    steps = []
    for previous, sample in zip(samples, samples[1:]):
        for pool in POOLS:
            before, after = previous.desired.get(pool, 0), sample.desired.get(pool, 0)
            if before != after:
                steps.append((sample.t, pool, before, after))
    return steps


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Centred moving average: the mean of each value and the `window // 2` on either side (fewer at the ends)."""
    half = window // 2
    sums = [0.0]
    for value in values:
        sums.append(sums[-1] + value)
    out = []
    for i in range(len(values)):
        low, high = max(0, i - half), min(len(values), i + half + 1)
        out.append((sums[high] - sums[low]) / (high - low))
    return out


POOL_COLORS = {"prefill": "tab:blue", "decode": "tab:orange"}


def write_plot(samples: Sequence[Sample], path: Path, bounds: Mapping[str, int]) -> None:
    """PNG: load (raw and smoothed), replicas per pool (ready, desired, max) with each scaling step marked, and
    TTFT/TPOT p90 against the SLA, over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    sent = [s.sent_rps for s in samples]
    axes[0].plot(t, sent, color="tab:gray", alpha=0.35, linewidth=0.8, label="requests sent / s")
    axes[0].plot(
        t,
        moving_average(sent, LOAD_SMOOTHING_S),
        color="black",
        linewidth=2,
        label=f"{LOAD_SMOOTHING_S} s centred moving average",
    )
    axes[0].set_ylabel("load (req/s)")
    for index, pool in enumerate(POOLS):
        color = POOL_COLORS[pool]
        axes[1].step(
            t, [sum(s.ready.get(pool, {}).values()) for s in samples], where="post", color=color, label=f"{pool} ready"
        )
        axes[1].step(
            t,
            [s.desired.get(pool, 0) for s in samples],
            where="post",
            color=color,
            linestyle=":",
            label=f"{pool} desired",
        )
        # offset dashes, so equal bounds of both pools show as alternating colours instead of one hiding the other
        axes[1].axhline(
            bounds.get(pool, 0),
            color=color,
            linestyle=(index * 6, (6, 6)),
            linewidth=1.2,
            label=f"{pool} max {bounds.get(pool, 0)}",
        )
    for when, pool, before, after in scaling_steps(samples):
        up = after > before
        for axis in axes:
            axis.axvline(when, color=POOL_COLORS[pool], alpha=0.5, linewidth=0.8, linestyle="-" if up else "--")
        offset = 10 * POOLS.index(pool)  # two pools stepping at once: their labels one above the other
        axes[1].annotate(
            f"{before}\u2192{after}",
            (when, after),
            xytext=(3, 4 + offset if up else -12 - offset),
            textcoords="offset points",
            fontsize=7,
            color=POOL_COLORS[pool],
        )
    axes[1].set_ylim(0, max([*bounds.values(), 1]) + 2)  # room for the legend above the max lines
    axes[1].set_ylabel("replicas")
    for axis, field, target, name in (
        (axes[2], "ttft_p90_ms", SLA.ttft_ms, "TTFT"),
        (axes[3], "tpot_p90_ms", SLA.tpot_ms, "TPOT"),
    ):
        axis.plot(t, [getattr(s, field) for s in samples], color="tab:green", label=f"{name} p90 (client)")
        axis.axhline(target, color="tab:red", linestyle=":", label=f"SLA {target:.0f} ms")
        axis.set_ylabel(f"{name} (ms)")
    axes[3].set_xlabel("time (s); vertical lines: scaling steps (solid up, dashed down), coloured by pool")
    for axis in axes:
        axis.grid(alpha=0.3)
        axis.legend(loc="upper right", fontsize=8, ncol=3 if axis is axes[1] else 1)
    axes[0].set_title("pdfleet demo: load, replicas and latency")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Rows of cells as aligned text: the first column left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        indent
        + "  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)).rstrip()
        for row in rows
    ]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def summary_text(
    samples: Sequence[Sample],
    replay_summary: Mapping[str, Any],
    events: Sequence[str],
    startup_s: float,
    bounds: Mapping[str, int],
) -> str:
    """The end-of-demo text summary: aligned plain text, no raw data structures (pure)."""
    s, sla, attained = replay_summary, replay_summary["sla"], replay_summary["sla_attainment"]
    errors = f"{s['errors']}"
    if s["error_kinds"]:
        errors += " (" + ", ".join(f"{kind} {count}" for kind, count in sorted(s["error_kinds"].items())) + ")"
    lines = [
        f"pdfleet demo summary (fleet up in {startup_s:.0f} s)",
        "",
        "requests",
        *(
            f"  {key:<15}{value}"
            for key, value in (
                ("sent", s["requests"]),
                ("completed", s["completed"]),
                ("errors", errors),
                ("throughput", f"{s['throughput_rps']:.2f} req/s, {s['output_tokens_per_s']:.1f} output tokens/s"),
                ("over", f"{s['duration_s']:.0f} s"),
            )
        ),
        "",
        "latency, client side (ms)",
        *_table(
            [
                ["", "p50", "p90", "p99", "SLA", "attained"],
                *(
                    [name, *(_ms(s[key][q]) for q in ("p50", "p90", "p99")), f"{sla[key]:g}", f"{attained[short]:.1%}"]
                    for name, key, short in (("TTFT", "ttft_ms", "ttft"), ("TPOT", "tpot_ms", "tpot"))
                ),
                ["both", "", "", "", "", f"{attained['both']:.1%}"],
            ]
        ),
        "",
        "replicas (ready)",
    ]
    first, last = (samples[0], samples[-1]) if samples else (None, None)

    def ready(sample: Sample | None, pool: str) -> str:
        return "-" if sample is None else str(sum(sample.ready.get(pool, {}).values()))

    racks = sorted({rack for sample in samples for pool in POOLS for rack in sample.ready.get(pool, {})})
    lines += _table(
        [
            ["", "start", "peak", "final", "max", *(f"final {rack}" for rack in racks)],
            *(
                [
                    pool,
                    ready(first, pool),
                    str(max((sum(x.ready.get(pool, {}).values()) for x in samples), default=0)),
                    ready(last, pool),
                    str(bounds.get(pool, 0)),
                    *(str(last.ready.get(pool, {}).get(rack, 0)) if last else "-" for rack in racks),
                ]
                for pool in POOLS
            ),
        ]
    )
    lines += ["", f"scaling events ({len(events)}):"] + ([f"  {line}" for line in events] or ["  (none)"])
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="pdfleet demo", description=__doc__)
    p.add_argument("--duration", type=positive_float, default=240.0, help="seconds of load")
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="emulator",
        help="engine pods: the emulator (L4 timing, autoscaled pools) or real vLLM on the CPU (the tiny Llama, one "
        "prefill and one decode, installed by ./dev setup)",
    )
    p.add_argument(
        "--base-rate",
        type=positive_float,
        default=None,
        help="load at start and for the last 40%% of the run, req/s (1; vllm: 0.1)",
    )
    p.add_argument(
        "--peak-rate", type=positive_float, default=None, help="load at 30%% of the run, req/s (8; vllm: 0.4)"
    )
    p.add_argument("--racks", type=positive_int, default=2, help="racks of the local fleet")
    p.add_argument("--max-replicas", type=positive_int, default=4, help="autoscaling bound per pool")
    p.add_argument("--out", type=Path, default=Path("demo-out"), help="output folder")
    p.add_argument("--seed", type=int, default=0, help="seed of the load's request lengths")
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
        desired={pool: spec[pool]["replicas"] for pool in POOLS},
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
        bounds = max_replicas(pdd)
        model = pdd["spec"]["model"]["servedModelName"]
        vocab_size = real_vllm.tiny_model_vocab_size() if real else VOCAB_SIZE
        assert fleet.control_plane is not None
        header = watch_lines(fleet.control_plane.kubeconfig, fleet.prometheus.url)
        print("\n".join(["", *header, ""]), flush=True)
        print(
            f"fleet up in {startup_s:.0f} s; PDDeployment {NAMESPACE}/{NAME} applied (max replicas: "
            + ", ".join(f"{pool} {bound}" for pool, bound in bounds.items())
            + "), waiting for it to serve...",
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
                    screen = render_view(sample, args.duration, events, racks, bounds, header)
                    print("\x1b[H\x1b[2J" + screen, flush=True)
                elif len(samples) % 5 == 1:
                    print(plain_line(sample, bounds), flush=True)
                time.sleep(max(0.0, 1.0 - (time.monotonic() - load_start - elapsed)))
        finally:
            stop.set()
            worker.join(timeout=15)
            events = scaling_events(fleet.events(NAMESPACE, NAME)) if fleet.api is not None else events
            _write_outputs(args.out, samples, log.all(), events, startup_s, time.monotonic() - load_start, bounds)
    return 0


def _write_outputs(
    out: Path,
    samples: Sequence[Sample],
    results: Sequence[RequestResult],
    events: Sequence[str],
    startup_s: float,
    duration_s: float,
    bounds: Mapping[str, int],
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    replay_summary = summarize(results, SLA, duration_s)
    timeline = {
        "samples": [asdict(s) for s in samples],
        "max_replicas": dict(bounds),
        "replay": replay_summary,
        "events": list(events),
    }
    (out / "timeline.json").write_text(json.dumps(timeline, indent=1))
    text = summary_text(samples, replay_summary, events, startup_s, bounds)
    (out / "summary.txt").write_text(text)
    if samples:
        write_plot(samples, out / "demo.png", bounds)
    print("\n" + text + f"\nwrote {out / 'demo.png'}, {out / 'summary.txt'}, {out / 'timeline.json'}", flush=True)


def main(argv: list[str]) -> int:
    """Entry point of `pdfleet demo`."""
    args = _parser().parse_args(argv)
    try:
        with termination_as_interrupt():
            return run_demo(args)
    except (MissingBinariesError, FileNotFoundError, RuntimeError) as error:
        print(f"pdfleet demo: {error}\n(`./dev setup` installs everything the demo needs)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: the fleet has been stopped, no process left behind", file=sys.stderr)
        return 130
