"""Prometheus scrapes real vLLM engines and the autoscaler reads their histograms and queue gauges: a load that
saturates the tiny decode (two sequences per batch) scales the decode pool up, and it scales back down when the load
stops. The fleet has no prefill replica (every request goes straight to the decode), so at most two engines run."""

from __future__ import annotations

from typing import Any

import pytest

from pdfleet.localfleet import real_vllm
from pdfleet.localfleet.harness import LocalFleet
from pdfleet.testing.load import BackgroundLoad, Phase, phased_trace

NAME = "tiny-scale"


def autoscaled_pdd(namespace: str, prometheus_url: str) -> dict[str, Any]:
    fields = real_vllm.pdd_spec_fields()
    fields["engine"]["args"] += ["--max-num-seqs", "2"]  # vLLM takes the last value: a decode batch of two
    return {
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            **fields,
            "prefill": {"replicas": 0, "gpuProduct": "NVIDIA-L4"},
            "decode": {
                "replicas": 1,
                "gpuProduct": "NVIDIA-L4",
                "autoscaling": {
                    "enabled": True,
                    "minReplicas": 1,
                    "maxReplicas": 2,
                    "targetQueueDepthPerReplica": 1,
                    "scaleDownStabilizationSeconds": 10,
                },
            },
            "sla": {"ttftMs": 2000, "tpotMs": 1000},
            "autoscaler": {"intervalSeconds": 3, "windowSeconds": 10, "drainTimeoutSeconds": 20},
            "prometheus": {"url": prometheus_url},
        },
    }


def decode_replicas(fleet: LocalFleet, namespace: str) -> int:
    return fleet.get(namespace, NAME)["spec"]["decode"]["replicas"]


@pytest.mark.timeout(900)
def test_real_vllm_queueing_scales_the_decode_pool_up_and_the_pool_shrinks_when_the_load_stops(
    vllm_fleet: LocalFleet, vllm_namespace: str
):
    fleet, namespace = vllm_fleet, vllm_namespace
    assert fleet.prometheus is not None
    fleet.apply(autoscaled_pdd(namespace, fleet.prometheus.url))
    fleet.wait_serving(namespace, NAME, timeout=420)
    # Two requests a second of ~128-token answers outrun a batch of two streams unless a decode step takes under 8 ms
    # (the tiny Llama's take 10-200 ms here): the decode's waiting queue grows however busy the machine is.
    trace = phased_trace([Phase(120, 2, 32, 128)])
    router = fleet.router_url(namespace, NAME)
    with BackgroundLoad(router, trace, real_vllm.SERVED_MODEL_NAME, real_vllm.tiny_model_vocab_size()) as load:
        fleet.wait_for(lambda: decode_replicas(fleet, namespace) == 2, 180, "decode scaled up to 2", interval=1.0)
        # decided on what vLLM reported: the decode's queue or latency past its target
        # the Event is posted after the spec patch: wait for it too
        scaled_up = fleet.wait_for(
            lambda: next((e for e in fleet.events(namespace, NAME) if e["reason"] == "ScaledUp"), None),
            30,
            "the ScaledUp event",
            interval=1.0,
        )
        assert scaled_up["message"].startswith("decode"), scaled_up["message"]
        fleet.wait_serving(namespace, NAME, timeout=300)  # the new real engine loads and takes traffic
    assert any(r.ok for r in load.results), "no request completed under the load"
    fleet.wait_for(lambda: decode_replicas(fleet, namespace) == 1, 180, "decode back to 1 after the load", interval=1.0)
