"""PDDeployment model: defaults, wire aliases, and every validation message."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pdfleet.api.model import (
    PDDeploymentSpec,
    PDDeploymentStatus,
    PoolStatus,
    SpecError,
    parse_spec,
    validate_name,
)
from pdfleet.autoscale.config import policy_config_from_spec
from pdfleet.testing.builders import pdd_spec

SAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "samples"
MINIMAL = pdd_spec()


def test_defaults_follow_the_architecture_doc() -> None:
    spec = parse_spec(MINIMAL)
    assert spec.engine.kind == "vllm" and spec.engine.port == 8000
    assert spec.kv_transfer.connector == "nixl" and spec.kv_transfer.cache_dtype == "auto"
    assert spec.engine.image == "vllm/vllm-openai:v0.32.0"
    kv = spec.kv_transfer
    assert (kv.buffer_device, kv.side_channel_port, kv.bootstrap_port, kv.mooncake_protocol) == (None,) * 4
    assert (kv.ucx_transports, kv.ucx_net_devices) == (None, None)
    assert (kv.effective_side_channel_port, kv.effective_bootstrap_port) == (5600, 8998)  # vLLM's defaults
    assert spec.prefill.replicas == 1 and spec.decode.gpus_per_replica == 1
    scaling = spec.prefill.autoscaling
    assert (scaling.enabled, scaling.min_replicas, scaling.max_replicas) == (False, 0, 8)
    assert spec.decode.autoscaling.min_replicas == 1  # a decode pool at zero would serve nothing
    assert (scaling.tolerance, scaling.max_scale_up_step, scaling.max_scale_down_step) == (0.1, 4, 1)
    assert scaling.scale_down_stabilization_seconds == 300
    assert scaling.capacity_tokens_per_second is None
    assert spec.topology.rack_label == "topology.pdfleet.dev/rack"
    assert spec.topology.placement == "RackPaired"
    assert (spec.router.port, spec.router.admin_port, spec.router.policy.locality) == (8080, 8081, "preferred")
    assert spec.router.policy.disaggregate_min_prompt_tokens == 256
    assert (spec.sla.ttft_ms, spec.sla.tpot_ms, spec.sla.percentile) == (500, 50, 90)
    assert spec.autoscaler.gpu_budget is None and spec.autoscaler.pd_ratio is None
    assert spec.prometheus.url == "http://prometheus-operated.monitoring.svc:9090"


def test_wire_form_is_camel_case_and_round_trips() -> None:
    wire = parse_spec(MINIMAL).model_dump(by_alias=True, mode="json")
    assert "kvTransfer" in wire and "gpusPerReplica" in wire["prefill"]
    assert "disaggregateMinPromptTokens" in wire["router"]["policy"]
    assert parse_spec(wire) == parse_spec(MINIMAL)


def test_snake_case_names_populate_too() -> None:
    spec = PDDeploymentSpec(model={"name": "m"}, kv_transfer={"cache_dtype": "fp8"})
    assert spec.kv_transfer.cache_dtype == "fp8"


def test_served_name_and_latency_targets_default_sensibly() -> None:
    spec = parse_spec(pdd_spec(decode={"autoscaling": {"targetLatencyMs": 30}}))
    assert spec.model.served_name == "meta-llama/Llama-3.1-8B-Instruct"
    assert spec.target_latency_ms("prefill") == 500
    assert spec.target_latency_ms("decode") == 30
    assert parse_spec({"model": {"name": "x", "servedModelName": "y"}}).model.served_name == "y"


def test_numeric_quantities_become_strings() -> None:
    spec = parse_spec(pdd_spec(prefill={"resources": {"cpu": 8, "memory": "64Gi"}}))
    assert spec.prefill.resources == {"cpu": "8", "memory": "64Gi"}


def test_capacity_per_replica_reaches_the_policy_per_pool() -> None:
    spec = parse_spec(pdd_spec(prefill={"autoscaling": {"capacityTokensPerSecond": 6000}}))
    config = policy_config_from_spec(spec, capacity_tokens_per_s={"prefill": 1, "decode": 2500})
    # the spec's value wins over the caller's default; a pool without one takes the default
    assert (config.prefill.capacity_tokens_per_s, config.decode.capacity_tokens_per_s) == (6000, 2500)
    assert policy_config_from_spec(parse_spec(MINIMAL)).prefill.capacity_tokens_per_s is None


def test_replicas_outside_autoscaling_bounds_are_allowed() -> None:
    spec = parse_spec(pdd_spec(prefill={"replicas": 20, "autoscaling": {"enabled": True, "maxReplicas": 4}}))
    assert spec.prefill.replicas == 20


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            pdd_spec(prefill={"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}),
            "spec.prefill.autoscaling: minReplicas (5) must be <= maxReplicas (2)",
        ),
        (pdd_spec(prefil={}), "spec.prefil: unknown field (check its spelling; fields are camelCase)"),
        (pdd_spec(decode={"replica": 2}), "spec.decode.replica: unknown field"),
        ({}, "spec.model: required field is missing"),
        (pdd_spec(engine={"kind": "trt"}), "spec.engine.kind: Input should be 'vllm' or 'sglang', got 'trt'"),
        (
            pdd_spec(engine={"kind": "sglang"}, kvTransfer={"connector": "lmcache"}),
            "spec.kvTransfer.connector: sglang supports nixl or mooncake, not lmcache",
        ),
        (
            pdd_spec(engine={"kind": "sglang"}, kvTransfer={"cacheDtype": "int8"}),
            "spec.kvTransfer.cacheDtype: sglang supports auto or fp8, not int8",
        ),
        (
            pdd_spec(decode={"resources": {"cpu": "eight"}}),
            "spec.decode.resources.cpu: 'eight' is not a Kubernetes quantity",
        ),
        (
            pdd_spec(decode={"resources": {"nvidia.com/gpu": 1}}),
            "spec.decode: resources must not set nvidia.com/gpu; use gpusPerReplica",
        ),
        (
            pdd_spec(prefill={"gpuProduct": "NVIDIA-H100-80GB-HBM3", "gpusPerReplica": 0}),
            "spec.prefill: gpusPerReplica must be >= 1 when gpuProduct is set (got 0)",
        ),
        (pdd_spec(prefill={"replicas": -1}), "spec.prefill.replicas: Input should be greater than or equal to 0"),
        (
            pdd_spec(topology={"rackLabel": "bad key!"}),
            "spec.topology.rackLabel: 'bad key!' must match the pattern",
        ),
        (pdd_spec(topology={"placement": "Packed"}), "spec.topology.placement: Input should be"),
        (
            pdd_spec(decode={"autoscaling": {"capacityTokensPerSecond": 0}}),
            "spec.decode.autoscaling.capacityTokensPerSecond: Input should be greater than 0",
        ),
        (
            pdd_spec(autoscaler={"gpuBudget": 1}),
            "spec.autoscaler.gpuBudget: 1 GPUs is less than the pools need at least (prefill 1 x 1 + decode 1 x 1 = 2)",
        ),
        (
            pdd_spec(autoscaler={"pdRatio": {"min": 3, "max": 1}}),
            "spec.autoscaler.pdRatio: min (3) must be <= max (1)",
        ),
        (
            pdd_spec(autoscaler={"pdRatio": {"min": 0, "max": 1}}),
            "spec.autoscaler.pdRatio.min: Input should be greater than 0",
        ),
        (
            pdd_spec(engine={"env": [{"name": "A", "value": "1"}, {"name": "A"}]}),
            "spec.engine: env names must be unique, repeated: A",
        ),
        (
            pdd_spec(engine={"env": [{"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {}}}]}),
            "spec.engine.env[0]: env A: set either value or valueFrom, not both",
        ),
        (
            pdd_spec(router={"port": 9000, "adminPort": 9000}),
            "spec.router: port and adminPort must differ (both 9000)",
        ),
        (pdd_spec(router={"port": 70000}), "spec.router.port: Input should be less than or equal to 65535"),
        (pdd_spec(sla={"percentile": 100}), "spec.sla.percentile: Input should be less than 100"),
        (pdd_spec(prometheus={"url": "prometheus:9090"}), "spec.prometheus.url: 'prometheus:9090' must match"),
        (
            pdd_spec(prefill={"tolerations": [{"operator": "Maybe"}]}),
            "spec.prefill.tolerations[0].operator: Input should be 'Exists' or 'Equal', got 'Maybe'",
        ),
        (
            pdd_spec(engine={"kind": "sglang"}, kvTransfer={"bufferDevice": "cpu"}),
            "spec.kvTransfer.bufferDevice: applies to vLLM's KV connectors, not engine.kind sglang",
        ),
        (
            pdd_spec(engine={"kind": "sglang"}, kvTransfer={"ucxTransports": ["tcp"]}),
            "spec.kvTransfer.ucxTransports: applies to vLLM's KV connectors, not engine.kind sglang",
        ),
        (
            pdd_spec(kvTransfer={"connector": "mooncake", "bufferDevice": "cpu"}),
            "spec.kvTransfer.bufferDevice: applies to connector nixl, not mooncake",
        ),
        (
            pdd_spec(kvTransfer={"connector": "mooncake", "ucxNetDevices": ["mlx5_0:1"]}),
            "spec.kvTransfer.ucxNetDevices: applies to connector nixl or lmcache, not mooncake",
        ),
        (
            pdd_spec(kvTransfer={"connector": "lmcache", "sideChannelPort": 5601}),
            "spec.kvTransfer.sideChannelPort: applies to connector nixl, not lmcache",
        ),
        (
            pdd_spec(kvTransfer={"mooncakeProtocol": "tcp"}),
            "spec.kvTransfer.mooncakeProtocol: applies to connector mooncake, not nixl",
        ),
        (
            pdd_spec(kvTransfer={"bootstrapPort": 9000}),
            "spec.kvTransfer.bootstrapPort: applies to connector mooncake, not nixl",
        ),
        (
            pdd_spec(kvTransfer={"bufferDevice": "xpu"}),
            "spec.kvTransfer.bufferDevice: Input should be 'cuda' or 'cpu', got 'xpu'",
        ),
        (
            pdd_spec(engine={"port": 5600}),
            "spec.engine.port: 5600 is also the NIXL side channel port (kvTransfer.sideChannelPort, default 5600); "
            "give one of them another port",
        ),
        (
            pdd_spec(engine={"port": 9000}, kvTransfer={"sideChannelPort": 9000}),
            "spec.engine.port: 9000 is also the NIXL side channel port",
        ),
        (
            pdd_spec(engine={"port": 8998}, kvTransfer={"connector": "mooncake"}),
            "spec.engine.port: 8998 is also the Mooncake bootstrap server port (kvTransfer.bootstrapPort, default",
        ),
        (
            pdd_spec(kvTransfer={"ucxTransports": ["tcp"]}, engine={"env": [{"name": "UCX_TLS", "value": "rc"}]}),
            "spec.kvTransfer.ucxTransports: engine.env also sets UCX_TLS; set only one of them",
        ),
        (
            pdd_spec(
                kvTransfer={"sideChannelPort": 5601},
                engine={"env": [{"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": "5602"}]},
            ),
            "spec.kvTransfer.sideChannelPort: engine.env also sets VLLM_NIXL_SIDE_CHANNEL_PORT; set only one of them",
        ),
        (
            pdd_spec(kvTransfer={"ucxTransports": ["tcp,sm"]}),
            "spec.kvTransfer.ucxTransports[0]: 'tcp,sm' must match the pattern",
        ),
        (
            pdd_spec(kvTransfer={"ucxNetDevices": []}),
            "spec.kvTransfer.ucxNetDevices: List should have at least 1 item",
        ),
        (
            pdd_spec(kvTransfer={"sideChannelPort": 0}),
            "spec.kvTransfer.sideChannelPort: Input should be greater than or equal to 1",
        ),
    ],
)
def test_invalid_specs_name_the_field_and_the_fix(spec: dict, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(spec)
    assert caught.value.message.startswith(message), caught.value.message
    assert "\n" not in caught.value.message


def test_every_error_is_reported_in_one_message() -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(pdd_spec(prefill={"replicas": -1}, decode={"gpusPerReplica": -2}))
    assert "spec.prefill.replicas" in caught.value.message and "spec.decode.gpusPerReplica" in caught.value.message


def test_gpu_budget_counts_autoscaling_minimums() -> None:
    scaled = {"replicas": 9, "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 9}}
    assert parse_spec(pdd_spec(prefill=scaled, decode=scaled, autoscaler={"gpuBudget": 2})).autoscaler.gpu_budget == 2


def test_spec_must_be_an_object() -> None:
    with pytest.raises(SpecError, match="spec: must be an object"):
        parse_spec(["not", "a", "dict"])  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["llama", "llama-70b", "a" * 44])
def test_usable_names(name: str) -> None:
    validate_name(name)


@pytest.mark.parametrize("name", ["Llama", "8b-model", "llama.70b", "a" * 45, "llama-"])
def test_unusable_names(name: str) -> None:
    with pytest.raises(SpecError, match="metadata.name"):
        validate_name(name)


def test_status_round_trips_on_the_wire() -> None:
    wire = {
        "observedGeneration": 3,
        "prefill": PoolStatus.of(desired=2, current=2, ready=1).model_dump(by_alias=True),
        "cells": [
            {"name": "x-prefill-rack-a", "pool": "prefill", "rack": "rack-a", "zone": "z", "desired": 2, "ready": 1}
        ],
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "Waiting",
                "message": "m",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
            }
        ],
        "autoscaler": {
            "prefill": {
                "desiredReplicas": 3,
                "drivingSignal": "ttft",
                "signals": {"ttft": 0.7},
                "lastScaleTime": "2025-01-01T00:00:00Z",
            },
            "metrics": {"available": True, "reason": "Ok", "message": ""},
        },
        "drain": {"pool": "decode", "targetReplicas": 1, "endpoints": ["x-decode-rack-a-1"], "startedAt": "t"},
        "kopf": {"progress": {}},
    }
    status = PDDeploymentStatus.model_validate(wire)
    assert status.prefill.summary == "1/2"
    assert status.drain is not None and status.drain.endpoints == ["x-decode-rack-a-1"]
    assert status.autoscaler is not None and status.autoscaler.prefill.driving_signal == "ttft"
    assert status.model_dump(by_alias=True, exclude_none=True)["cells"] == wire["cells"]


def test_basic_sample_is_a_valid_two_by_two_fleet() -> None:
    sample = yaml.safe_load((SAMPLES / "basic.yaml").read_text())
    assert (sample["apiVersion"], sample["kind"]) == ("pdfleet.dev/v1alpha1", "PDDeployment")
    validate_name(sample["metadata"]["name"])
    spec = parse_spec(sample["spec"])
    assert (spec.prefill.replicas, spec.decode.replicas) == (2, 2)
    assert (spec.prefill.gpus_per_replica, spec.decode.gpus_per_replica) == (1, 1)
    assert spec.topology.placement == "RackPaired"


def test_kv_transport_fields_for_cpu_memory_and_non_rdma_transports() -> None:
    nixl = parse_spec(
        pdd_spec(
            kvTransfer={
                "bufferDevice": "cpu",
                "sideChannelPort": 5700,
                "ucxTransports": ["tcp", "sm", "self", "^cuda_ipc"],
                "ucxNetDevices": ["eth0", "mlx5_0:1"],
            }
        )
    ).kv_transfer
    assert (nixl.buffer_device, nixl.effective_side_channel_port) == ("cpu", 5700)
    assert nixl.ucx_transports == ["tcp", "sm", "self", "^cuda_ipc"] and nixl.ucx_net_devices == ["eth0", "mlx5_0:1"]
    mooncake = parse_spec(
        pdd_spec(kvTransfer={"connector": "mooncake", "mooncakeProtocol": "tcp", "bootstrapPort": 9000})
    )
    assert (mooncake.kv_transfer.mooncake_protocol, mooncake.kv_transfer.effective_bootstrap_port) == ("tcp", 9000)
    # LMCache's disaggregated prefill moves the KV through NIXL: UCX settings apply to it too
    assert parse_spec(
        pdd_spec(kvTransfer={"connector": "lmcache", "ucxTransports": ["tcp"]})
    ).kv_transfer.ucx_transports
    # a user's env var of a name no typed field renders is fine next to the fields
    parse_spec(
        pdd_spec(kvTransfer={"ucxTransports": ["tcp"]}, engine={"env": [{"name": "UCX_NET_DEVICES", "value": "lo"}]})
    )
    wire = parse_spec(pdd_spec(kvTransfer={"bufferDevice": "cuda"})).model_dump(by_alias=True, mode="json")
    assert wire["kvTransfer"]["bufferDevice"] == "cuda" and parse_spec(wire).kv_transfer.buffer_device == "cuda"
