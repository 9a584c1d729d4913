"""Builders of test inputs: PDDeployment specs and bodies, fake Node objects and NodeInfo.

    spec = minimal_spec(kvTransfer={"connector": "mooncake"})       # a parsed PDDeploymentSpec: model + sections
    body = pdd_body("llama", fleet_spec(2, 2, gpu_product=H100))    # a PDDeployment as the API server takes it
    node = node_body("rack-a-node-0", "rack-a", gpus=4)             # Node API JSON (for node_info / node_summary)
    info = fake_node_info("rack-a-node-0", "rack-a")                 # a NodeInfo built directly, for placement

Specs are in wire form (camelCase keys, as in a manifest); every call returns fresh dicts, so tests may mutate them.
Label keys are the defaults of `TopologySpec`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pdfleet import API_GROUP, API_VERSION, KIND
from pdfleet.api.model import GPU_RESOURCE, PDDeploymentSpec, TopologySpec, parse_spec
from pdfleet.topology.inventory import NodeInfo, Taint

H100 = "NVIDIA-H100-80GB-HBM3"
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"
_TOPOLOGY = TopologySpec()


def pdd_spec(*, model: str = LLAMA_8B, served_name: str | None = None, **sections: Any) -> dict[str, Any]:
    """A PDDeployment spec: the model (and its served name, if given), then `sections` as given."""
    model_section = {"name": model} if served_name is None else {"name": model, "servedModelName": served_name}
    return {"model": model_section, **sections}


def minimal_spec(*, model: str = LLAMA_8B, served_name: str | None = None, **sections: Any) -> PDDeploymentSpec:
    """`pdd_spec(...)` parsed: everything not given takes the model's defaults."""
    return parse_spec(pdd_spec(model=model, served_name=served_name, **sections))


def fleet_spec(
    prefill: int = 2,
    decode: int = 2,
    *,
    model: str = LLAMA_8B,
    served_name: str | None = None,
    image: str = VLLM_IMAGE,
    gpu_product: str | None = None,
    autoscaling: Mapping[str, Any] | None = None,
    **sections: Any,
) -> dict[str, Any]:
    """A vLLM fleet spec: pools of `prefill` and `decode` replicas of one GPU each (of `gpu_product`, if given, and
    with `autoscaling`, if given); `sections` are added, or replace the ones built here."""

    def pool(replicas: int) -> dict[str, Any]:
        settings: dict[str, Any] = {"replicas": replicas, "gpusPerReplica": 1}
        if gpu_product is not None:
            settings["gpuProduct"] = gpu_product
        if autoscaling is not None:
            settings["autoscaling"] = dict(autoscaling)
        return settings

    built = {"engine": {"kind": "vllm", "image": image}, "prefill": pool(prefill), "decode": pool(decode)}
    return pdd_spec(model=model, served_name=served_name, **{**built, **sections})


def pdd_body(name: str, spec: Mapping[str, Any], **metadata: Any) -> dict[str, Any]:
    """A PDDeployment object (apiVersion, kind, metadata.name plus `metadata`, spec) as create calls take it."""
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": {"name": name, **metadata},
        "spec": spec,
    }


def node_labels(rack: str | None = None, *, zone: str | None = None, product: str | None = None) -> dict[str, str]:
    """The topology labels of a node (rack, zone, GPU product); a None value leaves its label out."""
    labels = {_TOPOLOGY.rack_label: rack, _TOPOLOGY.zone_label: zone, _TOPOLOGY.gpu_product_label: product}
    return {key: value for key, value in labels.items() if value is not None}


def node_body(
    name: str,
    rack: str | None = None,
    *,
    zone: str | None = "zone-1",
    product: str | None = H100,
    gpus: int = 8,
    ready: bool = True,
) -> dict[str, Any]:
    """A Node as Kubernetes API JSON: topology labels (see `node_labels`), `gpus` allocatable, a Ready condition."""
    return {
        "metadata": {"name": name, "labels": node_labels(rack, zone=zone, product=product)},
        "spec": {},
        "status": {
            "allocatable": {GPU_RESOURCE: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def fake_node_info(
    name: str,
    rack: str | None,
    *,
    zone: str | None = "zone-1",
    product: str | None = H100,
    gpus: int = 8,
    ready: bool = True,
    schedulable: bool = True,
    labels: Mapping[str, str] | None = None,
    taints: Iterable[Taint] = (),
) -> NodeInfo:
    """A NodeInfo built directly (not read from a Node object); `labels` are the extra labels selectors see."""
    return NodeInfo(
        name=name,
        rack=rack,
        zone=zone,
        gpu_product=product,
        gpu_allocatable=gpus,
        ready=ready,
        schedulable=schedulable,
        labels=dict(labels or {}),
        taints=tuple(taints),
    )
