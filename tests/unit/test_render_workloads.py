"""StatefulSets, Services and PDBs rendered from spec + placement."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from pdfleet.api.model import parse_spec
from pdfleet.render.children import render_fleet
from pdfleet.render.meta import Owner
from pdfleet.render.pdb import render_pool_pdb
from pdfleet.render.statefulset import render_cell_statefulset
from pdfleet.testing.builders import H100, fake_node_info, minimal_spec
from pdfleet.topology.placement import Cell, Placement, plan_placement

OWNER = Owner(name="llama", namespace="inference", uid="0000-1111")
CELL = Cell(pool="decode", rack="rack-a", zone="zone-1", replicas=3, name="llama-decode-rack-a")


def spec_of(**sections: object):
    return minimal_spec(model="m", served_name="llama", **sections)


def pod_of(sts: dict) -> dict:
    return sts["spec"]["template"]["spec"]


def test_statefulset_shape_labels_and_owner() -> None:
    sts = render_cell_statefulset(OWNER, spec_of(), CELL)
    assert (sts["apiVersion"], sts["kind"]) == ("apps/v1", "StatefulSet")
    meta = sts["metadata"]
    assert (meta["name"], meta["namespace"]) == ("llama-decode-rack-a", "inference")
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "pdfleet.dev/v1alpha1",
            "kind": "PDDeployment",
            "name": "llama",
            "uid": "0000-1111",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert meta["labels"] == {
        "app.kubernetes.io/name": "pdfleet",
        "app.kubernetes.io/instance": "llama",
        "app.kubernetes.io/component": "decode",
        "app.kubernetes.io/managed-by": "pdfleet-operator",
        "pdfleet.dev/pool": "decode",
        "pdfleet.dev/rack": "rack-a",
        "pdfleet.dev/zone": "zone-1",
        "pdfleet.dev/cell": "llama-decode-rack-a",
    }
    spec = sts["spec"]
    assert (spec["replicas"], spec["serviceName"], spec["podManagementPolicy"]) == (
        3,
        "llama-decode-rack-a",
        "Parallel",
    )
    assert spec["updateStrategy"] == {"type": "RollingUpdate"}
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= spec["template"]["metadata"]["labels"].items()
    assert selector["pdfleet.dev/cell"] == "llama-decode-rack-a"
    assert spec["template"]["metadata"]["labels"] == meta["labels"]
    assert spec["template"]["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8000",
        "prometheus.io/path": "/metrics",
    }


def test_engine_container_resources_probes_and_env() -> None:
    spec = spec_of(
        decode={"gpusPerReplica": 2, "resources": {"cpu": 8, "memory": "64Gi"}},
        engine={
            "env": [
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
                {"name": "PDFLEET_ZONE", "value": "override"},
            ]
        },
    )
    (container,) = pod_of(render_cell_statefulset(OWNER, spec, CELL))["containers"]
    assert container["image"] == "vllm/vllm-openai:v0.32.0"
    assert container["command"] == ["vllm", "serve"]
    assert container["ports"] == [
        {"name": "http", "containerPort": 8000, "protocol": "TCP"},
        {"name": "nixl-side", "containerPort": 5600, "protocol": "TCP"},  # NIXL's handshake side channel
    ]
    expected = {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "2"}
    assert container["resources"] == {"limits": expected, "requests": expected}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http", "scheme": "HTTP"}
    assert container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"] >= 1800
    env = {var["name"]: var for var in container["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"] == {"apiVersion": "v1", "fieldPath": "status.podIP"}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["PDFLEET_RACK"] == {"name": "PDFLEET_RACK", "value": "rack-a"}
    assert env["PDFLEET_ZONE"] == {"name": "PDFLEET_ZONE", "value": "override"}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    # NIXL: decode dials the prefill's side channel at the pod IP (vLLM's default "localhost" works on one host only)
    for name in ("VLLM_HOST_IP", "VLLM_NIXL_SIDE_CHANNEL_HOST"):
        assert env[name]["valueFrom"]["fieldRef"] == {"apiVersion": "v1", "fieldPath": "status.podIP"}
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": "5600"}
    assert len(env) == len(container["env"]), "env names must be unique for server-side apply"


def test_kv_transport_env_and_ports_of_the_spec_and_user_env_wins() -> None:
    spec = spec_of(
        engine={"port": 8100, "env": [{"name": "VLLM_HOST_IP", "value": "10.0.0.9"}]},
        kvTransfer={"sideChannelPort": 5700, "bufferDevice": "cpu", "ucxTransports": ["tcp"], "ucxNetDevices": ["lo"]},
    )
    (container,) = pod_of(render_cell_statefulset(OWNER, spec, CELL))["containers"]
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [("http", 8100), ("nixl-side", 5700)]
    env = {var["name"]: var for var in container["env"]}
    assert env["VLLM_HOST_IP"] == {"name": "VLLM_HOST_IP", "value": "10.0.0.9"}
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == "5700"
    assert (env["UCX_TLS"]["value"], env["UCX_NET_DEVICES"]["value"]) == ("tcp", "lo")
    assert len(env) == len(container["env"])
    assert '"kv_buffer_device":"cpu"' in container["args"][container["args"].index("--kv-transfer-config") + 1]


def test_mooncake_prefill_declares_its_bootstrap_port() -> None:
    spec = spec_of(kvTransfer={"connector": "mooncake"})
    prefill = Cell(pool="prefill", rack="rack-a", zone="zone-1", replicas=1, name="llama-prefill-rack-a")
    ports = {
        cell.pool: [p["name"] for p in pod_of(render_cell_statefulset(OWNER, spec, cell))["containers"][0]["ports"]]
        for cell in (prefill, CELL)
    }
    assert ports == {"prefill": ["http", "mooncake-boot"], "decode": ["http"]}


def test_pod_without_gpus_has_no_gpu_resource() -> None:
    (container,) = pod_of(render_cell_statefulset(OWNER, spec_of(decode={"gpusPerReplica": 0}), CELL))["containers"]
    assert container["resources"] == {}


def test_affinity_pins_rack_and_gpu_product() -> None:
    spec = spec_of(
        decode={
            "gpuProduct": H100,
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        }
    )
    pod = pod_of(render_cell_statefulset(OWNER, spec, CELL))
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [
        {
            "matchExpressions": [
                {"key": "topology.pdfleet.dev/rack", "operator": "In", "values": ["rack-a"]},
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": [H100]},
            ]
        }
    ]
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_unconstrained_cells_have_no_rack_affinity() -> None:
    cell = Cell(pool="prefill", rack="", zone="", replicas=2, name="llama-prefill-any")
    pod = pod_of(render_cell_statefulset(OWNER, spec_of(topology={"placement": "Unconstrained"}), cell))
    assert "affinity" not in pod
    spec = spec_of(topology={"placement": "Unconstrained"}, prefill={"gpuProduct": H100})
    terms = pod_of(render_cell_statefulset(OWNER, spec, cell))["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert [e["key"] for e in terms[0]["matchExpressions"]] == ["nvidia.com/gpu.product"]


@pytest.mark.parametrize("api_version", ["policy/v1", "policy/v1beta1"])
def test_pdb_api_version_switch(api_version: str) -> None:
    pdb = render_pool_pdb(OWNER, "prefill", api_version)
    assert pdb["apiVersion"] == api_version and pdb["kind"] == "PodDisruptionBudget"
    assert pdb["metadata"]["name"] == "llama-prefill"
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {
            "matchLabels": {
                "app.kubernetes.io/name": "pdfleet",
                "app.kubernetes.io/instance": "llama",
                "pdfleet.dev/pool": "prefill",
            }
        },
    }


def test_pdb_rejects_unknown_api_version() -> None:
    with pytest.raises(ValueError, match="policy/v2"):
        render_pool_pdb(OWNER, "decode", "policy/v2")


def placement_2x2() -> Placement:
    return Placement(
        cells=tuple(
            Cell(pool=pool, rack=rack, zone="zone-1", replicas=1, name=f"llama-{pool}-{rack}")
            for pool in ("prefill", "decode")
            for rack in ("rack-a", "rack-b")
        )
    )


def render_all(spec=None) -> list[dict]:
    return render_fleet(
        OWNER,
        spec or spec_of(),
        placement_2x2(),
        pdb_api_version="policy/v1beta1",
        operator_image="ghcr.io/pdfleet/pdfleet:dev",
    )


def test_fleet_has_every_child_once_with_owner_refs() -> None:
    objects = render_all()
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(kinds) == len(set(kinds))
    assert sorted(kinds) == sorted(
        [
            ("Service", "llama-prefill"),
            ("PodDisruptionBudget", "llama-prefill"),
            ("Service", "llama-decode"),
            ("PodDisruptionBudget", "llama-decode"),
            *[
                (kind, f"llama-{pool}-{rack}")
                for pool in ("prefill", "decode")
                for rack in ("rack-a", "rack-b")
                for kind in ("Service", "StatefulSet")
            ],
            ("Service", "llama-router"),
            ("Deployment", "llama-router"),
            ("PodDisruptionBudget", "llama-router"),
            ("NetworkPolicy", "llama-router"),
        ]
    )
    for obj in objects:
        assert obj["metadata"]["namespace"] == "inference"
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "0000-1111"
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "llama"
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "pdfleet-operator"


def test_services() -> None:
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in render_all()}
    headless = by_name[("Service", "llama-decode-rack-b")]["spec"]
    assert headless["clusterIP"] == "None"
    assert headless["selector"]["pdfleet.dev/cell"] == "llama-decode-rack-b"
    assert headless["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    pool = by_name[("Service", "llama-prefill")]["spec"]
    assert pool["type"] == "ClusterIP" and "pdfleet.dev/cell" not in pool["selector"]
    assert pool["selector"]["pdfleet.dev/pool"] == "prefill"
    router = by_name[("Service", "llama-router")]["spec"]
    assert [(p["name"], p["port"]) for p in router["ports"]] == [("http", 8080)]  # the admin port is not for clients
    assert router["selector"]["app.kubernetes.io/component"] == "router"


def test_rendering_is_deterministic_and_does_not_alias_input() -> None:
    spec = spec_of()
    before = copy.deepcopy(spec.model_dump())
    first = json.dumps(render_all(spec), sort_keys=True)
    assert json.dumps(render_all(spec), sort_keys=True) == first
    assert spec.model_dump() == before


def test_basic_sample_renders_a_rack_paired_two_by_two_fleet() -> None:
    sample = yaml.safe_load((Path(__file__).resolve().parents[2] / "manifests/samples/basic.yaml").read_text())
    spec = parse_spec(sample["spec"])
    nodes = [fake_node_info(f"{rack}-node-{i}", rack) for rack in ("rack-a", "rack-b") for i in range(2)]
    owner = Owner(name=sample["metadata"]["name"], namespace="default", uid="u")
    placement = plan_placement(spec, nodes, pdd_name=owner.name)
    objects = render_fleet(owner, spec, placement, pdb_api_version="policy/v1", operator_image="pdfleet:dev")
    stateful = sorted(o["metadata"]["name"] for o in objects if o["kind"] == "StatefulSet")
    assert stateful == [
        "llama-8b-decode-rack-a",
        "llama-8b-decode-rack-b",
        "llama-8b-prefill-rack-a",
        "llama-8b-prefill-rack-b",
    ]


# --- pod security (docs/security.md) ------------------------------------------------------------------------------

ENGINE_CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def test_engine_pods_drop_privileges_but_keep_the_images_user_by_default() -> None:
    pod = pod_of(render_cell_statefulset(OWNER, spec_of(), CELL))
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    (container,) = pod["containers"]
    # vLLM's image runs as root and writes its caches under $HOME and /tmp: no runAsNonRoot, no read-only root
    assert container["securityContext"] == ENGINE_CONTAINER_SECURITY
    assert pod["automountServiceAccountToken"] is False


def test_engine_security_context_from_the_spec_is_merged_over_the_defaults() -> None:
    spec = spec_of(
        engine={
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "runAsGroup": 1000,
                "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},  # RDMA memory registration
            }
        }
    )
    (container,) = pod_of(render_cell_statefulset(OWNER, spec, CELL))["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
    }


def test_router_pod_runs_non_root_read_only_without_capabilities_and_with_limits() -> None:
    (deployment,) = [o for o in render_all() if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"]["requests"] == {"cpu": "250m", "memory": "256Mi"}
    assert set(container["resources"]["limits"]) == {"cpu", "memory"}
    assert pod["automountServiceAccountToken"] is False


@pytest.mark.parametrize("api_version", ["policy/v1", "policy/v1beta1"])
def test_router_pdb_keeps_all_but_one_router_through_voluntary_disruptions(api_version: str) -> None:
    from pdfleet.render.pdb import render_router_pdb

    pdb = render_router_pdb(OWNER, api_version)
    assert (pdb["apiVersion"], pdb["kind"], pdb["metadata"]["name"]) == (
        api_version,
        "PodDisruptionBudget",
        "llama-router",
    )
    assert pdb["metadata"]["labels"]["app.kubernetes.io/component"] == "router"
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {
            "matchLabels": {
                "app.kubernetes.io/name": "pdfleet",
                "app.kubernetes.io/instance": "llama",
                "app.kubernetes.io/component": "router",
            }
        },
    }
    (deployment,) = [o for o in render_all() if o["kind"] == "Deployment"]
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    (in_fleet,) = [
        o for o in render_all() if o["kind"] == "PodDisruptionBudget" and o["metadata"]["name"] == "llama-router"
    ]
    assert in_fleet["apiVersion"] == "policy/v1beta1"  # the fleet's discovered PDB version
