"""Operator benchmark (issue 2): apply-to-StatefulSets latency and API writes of a no-op reconcile.

Runs a real control plane (kube-apiserver, controller-manager, scheduler, etcd on 127.0.0.1), 2 racks of GPU nodes, and
the operator process, then:
1. applies N PDDeployments one after another and times each from the create call until all of its cell StatefulSets
   exist (p50 / p99 / max);
2. lets the fleets settle, wakes every reconcile (touching a managed pod of each fleet triggers one) and reports how
   many API writes those reconciles made (target: 0).

    .venv/bin/python bench/operator_bench.py [--objects 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

from kubernetes import client

from pdfleet import API_GROUP, API_VERSION, PLURAL
from pdfleet.localfleet.controlplane import LocalControlPlane, wait_until
from pdfleet.localfleet.operator_process import OperatorProcess, install_crd
from pdfleet.localfleet.processes import termination_as_interrupt
from pdfleet.testing.builders import H100, fleet_spec, pdd_body


def fleet_body(name: str) -> dict:
    return pdd_body(name, fleet_spec(2, 2, gpu_product=H100))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=20)
    args = parser.parse_args()

    with termination_as_interrupt(), LocalControlPlane() as plane:  # SIGTERM too stops the control plane and operator
        plane.standard_fleet_nodes(racks=("rack-a", "rack-b"), nodes_per_rack=4, gpus=8)
        api = plane.api_client()
        install_crd(api)
        custom, apps, core = client.CustomObjectsApi(api), client.AppsV1Api(api), client.CoreV1Api(api)
        plane.create_namespace("bench")
        with OperatorProcess(plane.kubeconfig) as operator:
            latencies = []
            for index in range(args.objects):
                name = f"fleet-{index:02d}"
                started = time.perf_counter()
                custom.create_namespaced_custom_object(API_GROUP, API_VERSION, "bench", PLURAL, fleet_body(name))
                selector = f"app.kubernetes.io/instance={name}"
                wait_until(
                    lambda: len(apps.list_namespaced_stateful_set("bench", label_selector=selector).items) == 4,
                    60,
                    f"StatefulSets of {name}",
                    interval=0.01,
                )
                latencies.append(time.perf_counter() - started)

            time.sleep(5)  # settle: status and fleet views written, pods created and bound
            writes = operator.metric_sum("pdfleet_operator_reconcile_writes_total")
            reconciles = operator.metric_sum("pdfleet_operator_reconciles_total")
            for index in range(args.objects):
                pod = core.list_namespaced_pod(
                    "bench", label_selector=f"app.kubernetes.io/instance=fleet-{index:02d}", limit=1
                ).items[0]
                core.patch_namespaced_pod(pod.metadata.name, "bench", {"metadata": {"labels": {"bench": "touch"}}})
            wait_until(
                lambda: operator.metric_sum("pdfleet_operator_reconciles_total") >= reconciles + args.objects,
                60,
                "a reconcile of every touched fleet",
            )
            time.sleep(1)
            woken = operator.metric_sum("pdfleet_operator_reconciles_total") - reconciles
            extra_writes = operator.metric_sum("pdfleet_operator_reconcile_writes_total") - writes

    print(f"apply -> all cell StatefulSets created, over {len(latencies)} PDDeployments:")
    print(
        f"  p50 {percentile(latencies, 50) * 1000:.0f} ms   p99 {percentile(latencies, 99) * 1000:.0f} ms   "
        f"max {max(latencies) * 1000:.0f} ms   mean {statistics.mean(latencies) * 1000:.0f} ms"
    )
    print(f"no-op reconciles: {woken:.0f} ran, {extra_writes:.0f} API writes (target 0)")
    return 0 if extra_writes == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
