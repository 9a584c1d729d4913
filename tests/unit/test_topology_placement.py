"""Placement of pool replicas onto (pool, rack) cells."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from pdfleet.api.model import PDDeploymentSpec
from pdfleet.testing.builders import H100, fake_node_info, minimal_spec
from pdfleet.topology.inventory import NodeInfo, Taint
from pdfleet.topology.names import CELL_NAME_MAX, cell_name
from pdfleet.topology.placement import (
    Placement,
    PlacementError,
    distribute_replicas,
    plan_placement,
)

A100 = "NVIDIA-A100-SXM4-80GB"


def rack_nodes(racks: str = "ab", per_rack: int = 2, gpus: int = 8, product: str = H100, **kw: Any) -> list[NodeInfo]:
    return [
        fake_node_info(f"rack-{r}-node-{i}", f"rack-{r}", zone=f"zone-{r}", product=product, gpus=gpus, **kw)
        for r in racks
        for i in range(per_rack)
    ]


def fleet(prefill: int = 2, decode: int = 2, placement: str = "RackPaired", **pools: dict) -> PDDeploymentSpec:
    return minimal_spec(
        model="m",
        prefill={"replicas": prefill, **pools.get("prefill_spec", {})},
        decode={"replicas": decode, **pools.get("decode_spec", {})},
        topology={"placement": placement},
    )


def layout(placement: Placement, pool: str) -> dict[str, int]:
    return {cell.rack: cell.replicas for cell in placement.pool_cells(pool)}


def plan(spec: PDDeploymentSpec, nodes: list[NodeInfo], **kw: object) -> Placement:
    return plan_placement(spec, nodes, pdd_name="llama", **kw)


def test_basic_fleet_gets_one_cell_per_pool_and_rack() -> None:
    placement = plan(fleet(2, 2), rack_nodes())
    assert [(c.name, c.pool, c.rack, c.zone, c.replicas) for c in placement.cells] == [
        ("llama-prefill-rack-a", "prefill", "rack-a", "zone-a", 1),
        ("llama-prefill-rack-b", "prefill", "rack-b", "zone-b", 1),
        ("llama-decode-rack-a", "decode", "rack-a", "zone-a", 1),
        ("llama-decode-rack-b", "decode", "rack-b", "zone-b", 1),
    ]
    assert not placement.degraded and placement.replicas("prefill") == 2


@pytest.mark.parametrize(("prefill", "decode"), list(itertools.product(range(0, 7), range(1, 7))))
def test_rack_paired_every_prefill_rack_has_decode(prefill: int, decode: int) -> None:
    placement = plan(fleet(prefill, decode), rack_nodes("abcd", per_rack=1, gpus=4))
    decode_racks = set(layout(placement, "decode"))
    assert set(layout(placement, "prefill")) <= decode_racks
    assert placement.replicas("decode") == decode


def test_fewer_decode_than_racks_packs_prefill_into_decode_racks() -> None:
    placement = plan(fleet(prefill=6, decode=2), rack_nodes("abc"))
    assert layout(placement, "decode") == {"rack-a": 1, "rack-b": 1}
    assert layout(placement, "prefill") == {"rack-a": 3, "rack-b": 3}


def test_placement_is_deterministic_whatever_the_node_order() -> None:
    nodes = rack_nodes("abcd", per_rack=3)
    first = plan(fleet(7, 5), nodes)
    shuffled = nodes[:]
    random.Random(7).shuffle(shuffled)
    assert plan(fleet(7, 5), shuffled) == first


def test_scaling_prefill_never_changes_decode_cells() -> None:
    nodes = rack_nodes("abc", per_rack=2)
    decode_cells = {plan(fleet(p, 4), nodes).pool_cells("decode") for p in range(0, 30)}
    assert len(decode_cells) == 1


def test_scaling_decode_never_changes_prefill_cells_once_decode_covers_the_racks() -> None:
    nodes = rack_nodes("abc", per_rack=2)
    prefill_cells = {plan(fleet(5, d), nodes).pool_cells("prefill") for d in range(3, 12)}
    assert len(prefill_cells) == 1


def test_scaling_up_only_adds_replicas() -> None:
    nodes = rack_nodes("abc", per_rack=1, gpus=4)
    previous: dict[str, int] = {}
    for replicas in range(0, 10):
        current = layout(plan(fleet(0, replicas), nodes), "decode")
        assert all(current[rack] >= count for rack, count in previous.items())
        assert sum(current.values()) == replicas
        previous = current


def test_replica_override_replaces_spec_replicas() -> None:
    placement = plan(fleet(1, 1), rack_nodes(), replicas={"prefill": 4})
    assert (placement.replicas("prefill"), placement.replicas("decode")) == (4, 1)


def test_gpu_product_selects_racks() -> None:
    nodes = rack_nodes("ab", product=H100) + rack_nodes("c", product=A100)
    spec = fleet(3, 3, prefill_spec={"gpuProduct": H100}, decode_spec={"gpuProduct": H100})
    placement = plan(spec, nodes)
    assert set(layout(placement, "prefill")) | set(layout(placement, "decode")) == {"rack-a", "rack-b"}


def test_capacity_is_floor_of_gpus_over_gpus_per_replica() -> None:
    spec = fleet(prefill=0, decode=10, decode_spec={"gpusPerReplica": 3})
    placement = plan(spec, rack_nodes("a", per_rack=2, gpus=8))
    assert placement.capacity["decode"] == {"rack-a": 4}
    assert placement.replicas("decode") == 4
    assert placement.issues[0].reason == "InsufficientCapacity"
    assert "decode: placed 4 of 10 replicas" in placement.issues[0].message


def test_pools_share_gpus_on_shared_nodes() -> None:
    nodes = rack_nodes("a", per_rack=1, gpus=4)
    assert not plan(fleet(2, 2), nodes).degraded
    crowded = plan(fleet(3, 2), nodes)
    assert (crowded.replicas("prefill"), crowded.replicas("decode")) == (2, 2)
    assert crowded.degraded and crowded.issues[0].message.startswith("prefill: placed 2 of 3")


def test_decode_takes_nodes_prefill_cannot_use_first() -> None:
    nodes = rack_nodes("a", per_rack=1, gpus=2, product=H100) + [
        fake_node_info("rack-a-small", "rack-a", zone="zone-a", product=A100, gpus=2)
    ]
    spec = fleet(2, 2, prefill_spec={"gpuProduct": H100})
    placement = plan(spec, nodes)
    assert (placement.replicas("prefill"), placement.replicas("decode")) == (2, 2)


@pytest.mark.parametrize(
    ("nodes_kw", "reason"),
    [
        ({"ready": False}, "NoMatchingNodes"),
        ({"schedulable": False}, "NoMatchingNodes"),
        ({"gpus": 0}, "NoMatchingNodes"),
        ({"taints": (Taint("dedicated", "other", "NoSchedule"),)}, "NoMatchingNodes"),
    ],
)
def test_unusable_nodes_are_skipped(nodes_kw: dict, reason: str) -> None:
    with pytest.raises(PlacementError) as caught:
        plan(fleet(), rack_nodes(**nodes_kw))
    assert caught.value.reason == reason
    assert "no node fits the prefill pool (checked 4)" in caught.value.message


def test_taints_are_fine_when_tolerated_and_prefer_no_schedule_never_blocks() -> None:
    taints = (Taint("nvidia.com/gpu", "", "NoSchedule"), Taint("soft", "", "PreferNoSchedule"))
    tolerate = {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}
    assert plan(fleet(prefill_spec=tolerate, decode_spec=tolerate), rack_nodes(taints=taints)).replicas("decode") == 2


def test_no_gpu_product_anywhere_names_the_requirement() -> None:
    with pytest.raises(PlacementError) as caught:
        plan(fleet(decode_spec={"gpuProduct": "B200"}), rack_nodes())
    assert caught.value.reason == "NoMatchingNodes"
    assert "GPU product B200" in caught.value.message and "decode" in caught.value.message


def test_node_selector_must_match() -> None:
    selector = {"nodeSelector": {"pool": "fast"}}
    with pytest.raises(PlacementError, match="pool=fast"):
        plan(fleet(prefill_spec=selector), rack_nodes())
    nodes = rack_nodes(labels={"pool": "fast"})
    assert plan(fleet(prefill_spec=selector), nodes).replicas("prefill") == 2


def test_racks_without_room_for_both_pools_are_rejected() -> None:
    nodes = rack_nodes("a", product=H100) + rack_nodes("b", product=A100)
    spec = fleet(prefill_spec={"gpuProduct": H100}, decode_spec={"gpuProduct": A100})
    with pytest.raises(PlacementError) as caught:
        plan(spec, nodes)
    assert caught.value.reason == "RackWithoutDecode"
    assert "prefill fits rack-a, decode fits rack-b" in caught.value.message
    spread = plan(fleet(placement="Spread", prefill_spec={"gpuProduct": H100}, decode_spec={"gpuProduct": A100}), nodes)
    assert (layout(spread, "prefill"), layout(spread, "decode")) == ({"rack-a": 2}, {"rack-b": 2})


def test_prefill_without_decode_replicas_is_rejected_when_paired() -> None:
    with pytest.raises(PlacementError) as caught:
        plan(fleet(prefill=2, decode=0), rack_nodes())
    assert caught.value.reason == "RackWithoutDecode"


def test_nodes_without_rack_label_cannot_hold_rack_cells() -> None:
    nodes = [fake_node_info("n0", None, zone=None)]
    with pytest.raises(PlacementError) as caught:
        plan(fleet(), nodes)
    assert caught.value.reason == "NoRackLabel" and "topology.pdfleet.dev/rack" in caught.value.message
    assert plan(fleet(placement="Unconstrained"), nodes).replicas("prefill") == 2


def test_nothing_placeable_is_an_error_not_a_degradation() -> None:
    with pytest.raises(PlacementError) as caught:
        plan(fleet(prefill=1, decode=1, decode_spec={"gpusPerReplica": 8}), rack_nodes("a", per_rack=1))
    assert caught.value.reason == "InsufficientCapacity" and caught.value.message.startswith("prefill: placed 0 of 1")


def test_spread_places_pools_independently_over_their_racks() -> None:
    placement = plan(fleet(prefill=3, decode=5, placement="Spread"), rack_nodes("abc"))
    assert layout(placement, "prefill") == {"rack-a": 1, "rack-b": 1, "rack-c": 1}
    assert layout(placement, "decode") == {"rack-a": 2, "rack-b": 2, "rack-c": 1}


def test_unconstrained_has_one_cell_per_pool() -> None:
    placement = plan(fleet(3, 5, placement="Unconstrained"), rack_nodes("abc"))
    assert [(c.name, c.rack, c.zone, c.replicas) for c in placement.cells] == [
        ("llama-prefill-any", "", "", 3),
        ("llama-decode-any", "", "", 5),
    ]


def test_pools_without_gpus_are_not_limited_by_gpus() -> None:
    spec = fleet(40, 40, prefill_spec={"gpusPerReplica": 0}, decode_spec={"gpusPerReplica": 0})
    placement = plan(spec, rack_nodes("ab", gpus=0))
    assert layout(placement, "decode") == {"rack-a": 20, "rack-b": 20}


def test_distribute_replicas_round_robins_in_rack_order_within_capacity() -> None:
    assert distribute_replicas(5, {"b": 10, "a": 10, "c": 1}) == {"a": 2, "b": 2, "c": 1}
    assert distribute_replicas(2, {"b": 5, "a": 5, "c": 5}) == {"a": 1, "b": 1}
    assert distribute_replicas(9, {"a": 1, "b": 2}) == {"a": 1, "b": 2}
    assert distribute_replicas(3, {"a": 0, "b": 4}) == {"b": 3}
    assert distribute_replicas(0, {"a": 3}) == {}


def test_distribute_replicas_is_a_prefix_sequence() -> None:
    capacity = {"r1": 3, "r2": 1, "r3": 5}
    layouts = [distribute_replicas(n, capacity) for n in range(0, 10)]
    for smaller, larger in zip(layouts, layouts[1:]):
        assert sum(larger.values()) - sum(smaller.values()) == 1
        assert all(larger[rack] >= count for rack, count in smaller.items())


def test_cell_names_are_dns_labels_of_bounded_length() -> None:
    assert cell_name("llama", "prefill", "rack-a") == "llama-prefill-rack-a"
    odd = cell_name("llama", "decode", "Rack_A.1")
    assert odd.startswith("llama-decode-rack-a-1-") and len(odd) == len("llama-decode-rack-a-1-") + 8
    assert cell_name("llama", "decode", "rack-a.1") != cell_name("llama", "decode", "rack_a.1")
    long = cell_name("a" * 44, "prefill", "rack-" + "x" * 40)
    assert len(long) <= CELL_NAME_MAX and long[0].isalpha() and long[-1].isalnum()
    assert long != cell_name("a" * 44, "prefill", "rack-" + "x" * 41)
