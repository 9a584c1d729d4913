"""Router benchmark: our PD router vs sglang-router vs vllm-router on the same zero-delay engine emulators.

Everything runs on loopback inside a fresh network namespace (`unshare -n`) when available, so the peer routers can
make no outbound connection. The peers are pip-installed into bench/.peers-venv on first use (before entering the
namespace). Every process it starts is stopped on the way out (normal end, error, Ctrl-C, SIGTERM, SIGHUP), each
with its whole process group, and the bench fails if one of them still runs. Metrics per router: req/s and router CPU
µs per request (non-streaming), chunks/s and CPU µs per streamed chunk (256-token streams), p99 time to first chunk;
ratios are against sglang-router.

    .venv/bin/python bench/router_bench.py [--requests 2000] [--streams 300] [--routers ours,sglang,vllm]
    .venv/bin/python bench/router_bench.py --quick     (a smoke run: few requests, same steps)
    .venv/bin/python bench/router_bench.py --loadgen URL ...   (internal: the load generator process)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "operator"))

from pdfleet.localfleet.controlplane import die_with_parent_hook  # noqa: E402
from pdfleet.localfleet.processes import (  # noqa: E402
    interrupts_deferred,
    running_process_groups,
    stop_process,
    termination_as_interrupt,
)
from pdfleet.testing.engine_process import EngineProcess, start_engine  # noqa: E402

PEERS_VENV = REPO / "bench" / ".peers-venv"
PEER_PACKAGES = ("sglang-router==0.3.2", "vllm-router==0.1.17")
NETNS_MARK = "PDFLEET_BENCH_IN_NETNS"
MODEL = "bench-model"
PREFILL_PORTS = (18001, 18002)
DECODE_PORTS = (18101, 18102)
RACKS = ("rack-a", "rack-b")
# ~300 tokens by the router's 4-chars-per-token estimate: above disaggregateMinPromptTokens, so every router does PD
SHARED_PREFIX = "You are a helpful assistant. " * 45
CLK_TCK = os.sysconf("SC_CLK_TCK")
PEER_STOP_GRACE_S = 10.0  # a router's graceful shutdown; then SIGKILL to its whole group
INNER_STOP_GRACE_S = 90.0  # the bench inside the namespace stopping its routers and engines


# ---------------------------------------------------------------------------------------------------- load generator
class _CountingSink:
    """Counts SSE events and times the first body byte of one response."""

    __slots__ = ("done", "loop", "status", "first", "events", "error")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.done = loop.create_future()
        self.status = 0
        self.first = 0.0
        self.events = 0
        self.error = ""

    def on_head(self, status: int, content_type: bytes, content_length: int) -> None:
        self.status = status

    def on_body(self, data: bytes) -> None:
        if not self.first:
            self.first = self.loop.time()
        self.events += data.count(b"data: ")

    def on_batch_end(self) -> None:
        pass

    def on_complete(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def on_failure(self, error: Exception) -> None:
        self.error = str(error)
        if not self.done.done():
            self.done.set_result(None)


async def _load(url: str, requests: int, concurrency: int, stream: bool, max_tokens: int) -> dict:
    from pdfleet.router.httpclient import UpstreamPool

    host, port = url.split("//", 1)[1].rsplit(":", 1)
    pool = UpstreamPool(host, int(port), connect_timeout=5.0)
    loop = asyncio.get_running_loop()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n" % (
        host.encode(),
        port.encode(),
    )
    bodies = [
        json.dumps(
            {
                "model": MODEL,
                "prompt": f"{SHARED_PREFIX} question {i % 97}: what is {i}?",
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "stream": stream,
            }
        ).encode()
        for i in range(requests)
    ]
    counter = iter(range(requests))
    ttfc: list[float] = []
    stats = {"ok": 0, "errors": 0, "events": 0, "error_samples": []}

    async def worker() -> None:
        for i in counter:
            body = bodies[i]
            sink = _CountingSink(loop)
            start = loop.time()
            await pool.send(head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body), sink, 60.0)
            await sink.done
            if sink.error or sink.status != 200:
                stats["errors"] += 1
                if len(stats["error_samples"]) < 3:
                    stats["error_samples"].append(sink.error or f"HTTP {sink.status}")
                continue
            stats["ok"] += 1
            stats["events"] += sink.events
            ttfc.append(sink.first - start)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    pool.close()
    ttfc.sort()
    stats.update(elapsed=elapsed, p99_ttfc=ttfc[int(0.99 * (len(ttfc) - 1))] if ttfc else float("nan"))
    return stats


def loadgen_main(argv: list[str]) -> int:
    """The load generator process: prints one JSON line of results."""
    p = argparse.ArgumentParser()
    p.add_argument("--loadgen", required=True)
    p.add_argument("--requests", type=int, required=True)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--max-tokens", type=int, default=16)
    a = p.parse_args(argv)
    import uvloop

    print(json.dumps(uvloop.run(_load(a.loadgen, a.requests, a.concurrency, a.stream, a.max_tokens))))
    return 0


# ------------------------------------------------------------------------------------------------------ processes
def tree_cpu_seconds(pid: int) -> float:
    """utime+stime (incl. reaped children) of a process and all its live descendants, from /proc/<pid>/stat."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry)] = fields
            children.setdefault(int(fields[1]), []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        fields = stats.get(current)
        if fields:  # fields[11..14] = utime, stime, cutime, cstime (stat fields 14-17)
            total += sum(int(x) for x in fields[11:15])
        todo.extend(children.get(current, []))
    return total / CLK_TCK


@dataclass
class Proc:
    """A started process (leader of its own process group) and its log."""

    name: str
    popen: subprocess.Popen
    log: Path

    def stop(self, grace_s: float = PEER_STOP_GRACE_S) -> None:
        """SIGTERM the whole group, SIGKILL what still runs after `grace_s`; a second signal cannot cut it short."""
        with interrupts_deferred():
            stop_process(self.popen, grace_s=grace_s, group=True, reap_s=5)


STARTED: list[Proc] = []  # every process `start` made, so `reap_all` finds them whatever path the bench took


def start(name: str, argv: list[str], workdir: Path, env: dict[str, str] | None = None) -> Proc:
    """Start `argv` in its own process group (SIGTERM to it when the bench dies without cleaning up)."""
    log = workdir / f"{name}.log"
    with log.open("wb") as log_file:
        popen = subprocess.Popen(
            argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent_hook(),
            env={**os.environ, **(env or {})},
            cwd=workdir,
        )
    proc = Proc(name, popen, log)
    STARTED.append(proc)
    return proc


def reap_all(grace_s: float = PEER_STOP_GRACE_S) -> list[str]:
    """Stop every started process group still running; the names of any that survive that (should be none)."""
    for proc in STARTED:
        if proc.popen.poll() is None or proc.popen.pid in running_process_groups():
            proc.stop(grace_s)
    running = running_process_groups()
    return [proc.name for proc in STARTED if proc.popen.pid in running]


def http_status(url: str, body: bytes | None = None, timeout: float = 5.0) -> int:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
            return resp.status
    except Exception:  # noqa: BLE001 - any failure means "not yet"
        return 0


def wait_until(check, timeout: float, what: str, proc: Proc | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"{what}: process exited; log tail:\n{proc.log.read_text()[-2000:]}")
        if check():
            return
        time.sleep(0.25)
    raise RuntimeError(f"{what}: not ready after {timeout}s")


def start_engines() -> list[EngineProcess]:
    """2 prefill + 2 decode zero-delay emulators, one of each per rack."""
    engines: list[EngineProcess] = []
    for role, ports in (("prefill", PREFILL_PORTS), ("decode", DECODE_PORTS)):
        for port, rack in zip(ports, RACKS):
            engines.append(
                start_engine(
                    role, port, rack=rack, model=MODEL, extra_args=["--emulator-zero-delay"], startup_timeout=60
                )
            )
    return engines


def fleet_file(workdir: Path) -> Path:
    endpoints = [
        {
            "name": f"{pool}-{rack}",
            "pool": pool,
            "url": f"http://127.0.0.1:{port}",
            "rack": rack,
            "zone": "zone-1",
            "draining": False,
        }
        for pool, ports in (("prefill", PREFILL_PORTS), ("decode", DECODE_PORTS))
        for port, rack in zip(ports, RACKS)
    ]
    path = workdir / "fleet.json"
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "generation": 1,
                "model": MODEL,
                "endpoints": endpoints,
                "policy": {"locality": "preferred", "disaggregateMinPromptTokens": 256},
            }
        )
    )
    return path


def router_command(kind: str, port: int, metrics_port: int, workdir: Path) -> list[str]:
    if kind == "ours":
        return [
            sys.executable,
            "-m",
            "pdfleet",
            "router",
            "--fleet-file",
            str(fleet_file(workdir)),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--admin-port",
            str(metrics_port),
            "--log-level",
            "warning",
        ]
    bootstrap = (19001, 19002)
    prefill = [x for p, b in zip(PREFILL_PORTS, bootstrap) for x in ("--prefill", f"http://127.0.0.1:{p}", str(b))]
    decode = [x for p in DECODE_PORTS for x in ("--decode", f"http://127.0.0.1:{p}")]
    common = [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--policy",
        "round_robin",
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(metrics_port),
    ]
    if kind == "sglang":
        return [
            str(PEERS_VENV / "bin" / "python"),
            "-m",
            "sglang_router.launch_router",
            "--pd-disaggregation",
            *common,
            *prefill,
            *decode,
            "--log-level",
            "warn",
        ]
    prefill = [x for p in PREFILL_PORTS for x in ("--prefill", f"http://127.0.0.1:{p}")]
    return [
        str(PEERS_VENV / "bin" / "vllm-router"),
        "--vllm-pd-disaggregation",
        *common,
        *prefill,
        *decode,
        "--log-level",
        "warning",
    ]


# ------------------------------------------------------------------------------------------------------ measuring
@dataclass
class Result:
    router: str
    rps: float = 0.0
    cpu_us_per_request: float = 0.0
    chunks_per_s: float = 0.0
    cpu_us_per_chunk: float = 0.0
    p99_ttfc_ms: float = 0.0
    errors: int = 0
    notes: list[str] = field(default_factory=list)


def run_load(
    url: str, router_pid: int, requests: int, concurrency: int, stream: bool, max_tokens: int
) -> tuple[dict, float]:
    """Run the load generator process; (its results, router CPU seconds spent meanwhile)."""
    argv = [
        sys.executable,
        __file__,
        "--loadgen",
        url,
        "--requests",
        str(requests),
        "--concurrency",
        str(concurrency),
        "--max-tokens",
        str(max_tokens),
    ] + (["--stream"] if stream else [])
    cpu0 = tree_cpu_seconds(router_pid)
    out = subprocess.run(argv, capture_output=True, timeout=240, check=True)
    cpu = tree_cpu_seconds(router_pid) - cpu0
    return json.loads(out.stdout.decode().strip().splitlines()[-1]), cpu


def bench_router(kind: str, args: argparse.Namespace, workdir: Path, index: int) -> Result:
    port, metrics_port = 30001 + index, 29001 + index
    proc = start(
        f"router-{kind}",
        router_command(kind, port, metrics_port, workdir),
        workdir,
        env={"HF_HUB_OFFLINE": "1", "RUST_LOG": "warn"},
    )
    url = f"http://127.0.0.1:{port}"
    probe = json.dumps({"model": MODEL, "prompt": SHARED_PREFIX, "max_tokens": 2}).encode()
    result = Result(kind)
    try:
        wait_until(lambda: http_status(url + "/v1/completions", probe) == 200, 90, f"router {kind}", proc)
        run_load(url, proc.popen.pid, args.warmup, args.concurrency, False, 16)  # connection pools, caches, JIT-free
        plain, cpu = run_load(url, proc.popen.pid, args.requests, args.concurrency, False, 16)
        result.rps = plain["ok"] / plain["elapsed"]
        result.cpu_us_per_request = cpu / max(plain["ok"], 1) * 1e6
        result.errors += plain["errors"]
        result.notes += plain["error_samples"]
        streams, cpu = run_load(url, proc.popen.pid, args.streams, args.concurrency, True, 256)
        result.chunks_per_s = streams["events"] / streams["elapsed"]
        result.cpu_us_per_chunk = cpu / max(streams["events"], 1) * 1e6
        result.p99_ttfc_ms = streams["p99_ttfc"] * 1e3
        result.errors += streams["errors"]
        result.notes += streams["error_samples"]
    except Exception as exc:  # noqa: BLE001 - one router failing must not hide the others' numbers
        result.notes.append(f"failed: {exc}"[:500])
    finally:
        proc.stop()
    return result


def print_table(results: list[Result]) -> None:
    base = next((r for r in results if r.router == "sglang" and r.rps), None)

    def ratio(r: Result, attr: str) -> str:
        if base is None or not getattr(base, attr):
            return "   -"
        return f"{getattr(r, attr) / getattr(base, attr):5.2f}x"

    cols = ("router", "req/s", "CPU µs/req", "chunks/s", "CPU µs/chunk", "p99 TTFC ms", "errors")
    print("\n" + " | ".join(f"{c:>16}" for c in cols))
    for r in results:
        cells = (
            r.router,
            f"{r.rps:8.0f} {ratio(r, 'rps')}",
            f"{r.cpu_us_per_request:7.0f} {ratio(r, 'cpu_us_per_request')}",
            f"{r.chunks_per_s:8.0f} {ratio(r, 'chunks_per_s')}",
            f"{r.cpu_us_per_chunk:7.2f} {ratio(r, 'cpu_us_per_chunk')}",
            f"{r.p99_ttfc_ms:7.1f} {ratio(r, 'p99_ttfc_ms')}",
            str(r.errors),
        )
        print(" | ".join(f"{c:>16}" for c in cells))
    for r in results:
        for note in r.notes:
            print(f"  {r.router}: {note}")
    print("(ratios against sglang-router; CPU = utime+stime of the router process tree)")


# ------------------------------------------------------------------------------------------------------ entry
def ensure_peers() -> None:
    """Create bench/.peers-venv with the peer routers (needs the package registry: run before entering the netns)."""
    if (PEERS_VENV / "bin" / "vllm-router").exists() and (PEERS_VENV / "bin" / "python").exists():
        return
    subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    subprocess.run([str(PEERS_VENV / "bin" / "pip"), "install", "-q", *PEER_PACKAGES], check=True)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--loadgen":
        return loadgen_main(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--routers", default="ours,sglang,vllm")
    p.add_argument("--requests", type=int, default=2000, help="non-streaming requests per router")
    p.add_argument("--streams", type=int, default=300, help="256-chunk streaming requests per router")
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--no-netns", action="store_true", help="run on the host loopback (peers may try the network)")
    p.add_argument("--json", help="also write results here")
    p.add_argument(
        "--quick", action="store_true", help="a smoke run: 200 requests, 30 streams, 20 warm-up requests per router"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.requests, args.streams, args.warmup = 200, 30, 20
    routers = args.routers.split(",")
    if os.environ.get(NETNS_MARK) is None:
        if any(r != "ours" for r in routers):
            ensure_peers()
        if not args.no_netns and shutil.which("unshare") and shutil.which("ip"):
            return run_in_netns(argv)
        print("warning: no network namespace; peers run with HF_HUB_OFFLINE=1 only", file=sys.stderr)
    workdir = Path(tempfile.mkdtemp(prefix="pdfleet-router-bench-"))
    engines: list[EngineProcess] = []
    t0 = time.monotonic()
    results: list[Result] = []
    try:
        with termination_as_interrupt():
            engines = start_engines()
            results = [bench_router(kind, args, workdir, i) for i, kind in enumerate(routers)]
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        with interrupts_deferred():
            for e in engines:
                e.stop()
            survivors = reap_all()
        if survivors:
            print(f"error: processes of {', '.join(survivors)} still run after the bench", file=sys.stderr)
    if len(results) < len(routers):
        return 130
    print_table(results)
    reaped = "" if survivors else "; no process it started still runs"
    print(f"bench took {time.monotonic() - t0:.0f}s; logs in {workdir}{reaped}")
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ for r in results], indent=2))
    return 0 if all(r.errors == 0 and not r.notes for r in results) and not survivors else 1


def run_in_netns(argv: list[str]) -> int:
    """Re-run this bench inside `unshare -n` (only loopback) and wait for it; SIGTERM/SIGHUP are passed on to it."""
    inner_cmd = f"ip link set lo up && exec {sys.executable} {__file__} " + " ".join(map(_quote, argv))
    inner = subprocess.Popen(["unshare", "-n", "sh", "-c", inner_cmd], env={**os.environ, NETNS_MARK: "1"})
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the inner bench itself (same tty group)
    try:
        with termination_as_interrupt():
            return inner.wait()
    except KeyboardInterrupt:
        stop_process(inner, grace_s=INNER_STOP_GRACE_S)  # the inner bench reaps what it started on SIGTERM
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)


def _quote(word: str) -> str:
    import shlex

    return shlex.quote(word)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
