"""Node objects (API JSON) to NodeInfo."""

from __future__ import annotations

from pdfleet.api.model import Toleration, TopologySpec
from pdfleet.testing.builders import node_body
from pdfleet.topology.inventory import Taint, node_info


def node(**overrides: object) -> dict:
    """Node n1 in rack-a, with a CPU resource and a condition before Ready that the reader must skip."""
    body = node_body("n1", "rack-a")
    body["status"]["allocatable"]["cpu"] = "64"
    body["status"]["conditions"].insert(0, {"type": "MemoryPressure", "status": "False"})
    body.update(overrides)
    return body


def test_reads_topology_labels_gpus_and_readiness() -> None:
    info = node_info(node(), TopologySpec())
    assert (info.name, info.rack, info.zone, info.gpu_product) == ("n1", "rack-a", "zone-1", "NVIDIA-H100-80GB-HBM3")
    assert (info.gpu_allocatable, info.ready, info.schedulable) == (8, True, True)
    assert info.labels["topology.pdfleet.dev/rack"] == "rack-a"


def test_label_keys_come_from_the_topology_spec() -> None:
    body = node(metadata={"name": "n2", "labels": {"example.com/rack": "r9"}})
    info = node_info(body, TopologySpec(rack_label="example.com/rack"))
    assert (info.rack, info.zone, info.gpu_product) == ("r9", None, None)


def test_missing_or_odd_fields_mean_not_available() -> None:
    info = node_info({"metadata": {"name": "bare"}}, TopologySpec())
    assert (info.rack, info.gpu_allocatable, info.ready, info.schedulable) == (None, 0, False, True)
    odd_status = {"allocatable": {"nvidia.com/gpu": "lots"}, "conditions": [{"type": "Ready", "status": "Unknown"}]}
    odd = node_info(node(status=odd_status), TopologySpec())
    assert (odd.gpu_allocatable, odd.ready) == (0, False)


def test_cordoned_node_is_unschedulable_and_taints_are_kept() -> None:
    body = node(
        spec={
            "unschedulable": True,
            "taints": [
                {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                {"key": "soft", "value": "x", "effect": "PreferNoSchedule"},
            ],
        }
    )
    info = node_info(body, TopologySpec())
    assert not info.schedulable
    assert info.blocking_taints() == (Taint("nvidia.com/gpu", "", "NoSchedule"),)


def test_toleration_matching_follows_kubernetes() -> None:
    taint = Taint("nvidia.com/gpu", "present", "NoSchedule")
    assert taint.tolerated_by([Toleration(key="nvidia.com/gpu", operator="Exists")])
    assert taint.tolerated_by([Toleration(operator="Exists")])
    assert taint.tolerated_by([Toleration(key="nvidia.com/gpu", value="present", effect="NoSchedule")])
    assert not taint.tolerated_by([Toleration(key="nvidia.com/gpu", value="absent")])
    assert not taint.tolerated_by([Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoExecute")])
    assert not taint.tolerated_by([])
