"""Autoscaler benchmark (issue 4): reaction time from an SLA breach to the new replica count, and queries per interval.

Real parts only: a control plane and the operator process, a Prometheus (1 s scrapes) scraping two prefill and two
decode engine emulators (8B on A30 timing) that stand in for the pools' pods. For each trial a fresh PDDeployment is
created with autoscaling on and a prefill-heavy load is started; the bench polls Prometheus with the autoscaler's own
TTFT query to find when the breach became visible, and the API for when spec.prefill.replicas changed.

    .venv/bin/python bench/autoscaler_bench.py [--trials 3] [--interval 5]

Prints the reaction time per trial (seconds and in autoscaler intervals; target < 2 intervals) and the Prometheus
queries the operator made per pool per interval (counted on Prometheus's own query-handler counter).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import httpx
from kubernetes import client

from pdfleet import API_GROUP, API_VERSION, PLURAL
from pdfleet.autoscale.promql import Signal, fleet_queries
from pdfleet.localfleet.controlplane import LocalControlPlane, wait_until
from pdfleet.localfleet.operator_process import OperatorProcess, install_crd
from pdfleet.localfleet.processes import termination_as_interrupt
from pdfleet.localfleet.prometheus import ScrapeTarget, start_prometheus
from pdfleet.testing.builders import fleet_spec, pdd_body
from pdfleet.testing.engine_process import start_engine

MODEL = "llama-8b"
NAMESPACE = "bench"


def prefill_load(urls: list[str], stop: threading.Event, per_engine: int = 6) -> list[threading.Thread]:
    body = {"model": MODEL, "prompt": "word " * 1000, "max_tokens": 1}

    def loop(url: str) -> None:
        with httpx.Client(timeout=60, trust_env=False) as http:
            deadline = time.monotonic() + 120
            while not stop.is_set() and time.monotonic() < deadline:
                http.post(f"{url}/v1/completions", json=body)

    threads = [threading.Thread(target=loop, args=(u,), daemon=True) for u in urls for _ in range(per_engine)]
    for thread in threads:
        thread.start()
    return threads


def query_count(prometheus_url: str) -> float:
    text = httpx.get(f"{prometheus_url}/metrics", timeout=5, trust_env=False).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("prometheus_http_requests_total") and 'handler="/api/v1/query"' in line
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--interval", type=int, default=5, help="spec.autoscaler.intervalSeconds")
    args = parser.parse_args()
    kv = {"prefill": "kv_producer", "decode": "kv_consumer"}
    engines = {
        pool: [
            start_engine(
                pool,
                rack=rack,
                served_model_name=MODEL,
                extra_args=[
                    "--kv-transfer-config",
                    json.dumps({"kv_connector": "NixlConnector", "kv_role": role}),
                    "--emulator-model",
                    "llama-3.1-8b",
                    "--emulator-gpu",
                    "a30",
                ],
            )
            for rack in ("rack-a", "rack-b")
        ]
        for pool, role in kv.items()
    }
    reactions: list[float] = []
    try:
        with LocalControlPlane() as plane, start_prometheus(scrape_interval=1.0) as prometheus:
            plane.standard_fleet_nodes()
            api = plane.api_client()
            install_crd(api)
            plane.create_namespace(NAMESPACE)
            custom = client.CustomObjectsApi(api)
            with OperatorProcess(plane.kubeconfig):
                for trial in range(args.trials):
                    name = f"trial-{trial}"
                    prometheus.set_targets(
                        [
                            ScrapeTarget(
                                f"{e.host}:{e.port}",
                                {
                                    "namespace": NAMESPACE,
                                    "pdd": name,
                                    "pool": pool,
                                    "pod": f"{name}-{pool}-{e.rack}-0",
                                    "rack": e.rack,
                                },
                            )
                            for pool, processes in engines.items()
                            for e in processes
                        ]
                    )
                    prometheus.wait_for_healthy_targets(4, timeout=30)
                    scaling = {"enabled": True, "minReplicas": 2, "maxReplicas": 8}
                    body = pdd_body(
                        name,
                        fleet_spec(
                            2,
                            2,
                            served_name=MODEL,
                            autoscaling=scaling,
                            sla={"ttftMs": 500, "tpotMs": 200},
                            autoscaler={"intervalSeconds": args.interval, "windowSeconds": 10},
                            prometheus={"url": prometheus.url},
                        ),
                    )
                    custom.create_namespaced_custom_object(API_GROUP, API_VERSION, NAMESPACE, PLURAL, body)
                    ttft = next(
                        q.promql for q in fleet_queries("vllm", NAMESPACE, name, 10, 90) if q.signal == Signal.TTFT_P
                    )
                    time.sleep(2 * args.interval)  # a few quiet intervals: queries counted, nothing to scale
                    queries_before, counted_from = query_count(prometheus.url), time.monotonic()
                    time.sleep(3 * args.interval)
                    per_interval = (query_count(prometheus.url) - queries_before) / (
                        (time.monotonic() - counted_from) / args.interval
                    )

                    stop = threading.Event()
                    threads = prefill_load([e.url for e in engines["prefill"]], stop)
                    try:

                        def breached() -> float | None:
                            result = httpx.get(
                                f"{prometheus.url}/api/v1/query", params={"query": ttft}, timeout=5, trust_env=False
                            ).json()["data"]["result"]
                            values = [float(r["value"][1]) for r in result if r["metric"].get("pool") == "prefill"]
                            return time.monotonic() if values and values[0] > 0.5 else None

                        visible = wait_until(breached, 60, "TTFT breach visible in Prometheus", interval=0.1)

                        def scaled() -> float | None:
                            spec = custom.get_namespaced_custom_object(API_GROUP, API_VERSION, NAMESPACE, PLURAL, name)[
                                "spec"
                            ]
                            return time.monotonic() if spec["prefill"]["replicas"] > 2 else None

                        written = wait_until(scaled, 60, "prefill replicas written", interval=0.1)
                    finally:
                        stop.set()
                        for thread in threads:
                            thread.join(timeout=70)
                    reactions.append(written - visible)
                    print(
                        f"trial {trial}: breach visible -> replicas written {written - visible:.2f} s "
                        f"({(written - visible) / args.interval:.2f} intervals); "
                        f"Prometheus queries {per_interval:.1f} per interval for the fleet's two pools",
                        flush=True,
                    )
                    # One PDDeployment at a time, so the query count is one fleet's.
                    custom.delete_namespaced_custom_object(API_GROUP, API_VERSION, NAMESPACE, PLURAL, name)
                    time.sleep(5)  # let the queues drain before the next trial
    finally:
        for processes in engines.values():
            for engine in processes:
                engine.stop()
    print(
        f"reaction time over {len(reactions)} trials: mean {statistics.mean(reactions):.2f} s, "
        f"max {max(reactions):.2f} s = {max(reactions) / args.interval:.2f} intervals (target < 2); "
        f"queries per pool per interval: {per_interval / 2:.1f}"
    )
    return 0 if max(reactions) < 2 * args.interval else 1


if __name__ == "__main__":
    with termination_as_interrupt():  # SIGTERM stops the engines too, as Ctrl-C does
        raise SystemExit(main())
