"""Placement: which (pool, rack) cells a PDDeployment gets and how many replicas each holds.

Rules (pure and deterministic; racks are always taken in sorted name order):

- A node fits a pool when it is Ready, schedulable, carries the pool's gpuProduct (if set) and nodeSelector labels,
  tolerates its blocking taints, and has at least gpusPerReplica allocatable GPUs. A rack's capacity for a pool is the
  sum over its fitting nodes of floor(allocatable GPUs / gpusPerReplica).
- `distribute_replicas` deals replicas round-robin over the racks in name order, skipping full racks. The deal is a
  fixed sequence, so n+1 replicas are n replicas plus one: scaling up only adds and scaling down only removes, and a
  node flapping does not reorder racks (name order, not free capacity, decides; the doc's "largest free capacity
  first" would move replicas whenever capacity changes).
- Decode is placed first, from the nodes and its own replica count only, so decode cells never depend on prefill.
  Prefill is then placed into the capacity decode leaves (decode takes nodes that do not fit prefill first).
- RackPaired: decode spreads over the racks that fit both pools; prefill only goes to racks that got decode, so every
  rack with prefill has decode. Prefill cells therefore depend on decode replicas only when decode has fewer replicas
  than there are paired racks, or when a rack is too full for both pools.
- Spread: decode over every rack that fits it; prefill over every rack that fits it.
- Unconstrained: one cell per pool (rack ""), capacity summed over all fitting nodes; the scheduler picks nodes.
- Too little capacity is not an error while at least one replica of each requested pool fits: what fits is placed and
  the shortfall is reported in `Placement.issues` (the reconcile sets a Degraded condition). Nothing placeable for a
  requested pool raises PlacementError.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from pdfleet import POOLS
from pdfleet.api.model import PDDeploymentSpec, PoolSpec
from pdfleet.topology.inventory import NodeInfo
from pdfleet.topology.names import cell_name

# Replicas per node for a pool that asks for no GPUs: the scheduler's other limits decide.
UNBOUNDED_CAPACITY = 1_000_000
# Rack key of the single cell per pool under Unconstrained placement.
ANY_RACK = ""


class PlacementError(Exception):
    """The fleet cannot be placed at all; `reason` is a CamelCase condition reason, `message` says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Cell:
    """One StatefulSet: `replicas` pods of `pool` pinned to `rack` (ANY_RACK when unconstrained)."""

    pool: str
    rack: str
    zone: str
    replicas: int
    name: str


@dataclass(frozen=True)
class PlacementIssue:
    """A reason the placement is degraded (e.g. InsufficientCapacity) with a human-readable message."""

    reason: str
    message: str


@dataclass(frozen=True)
class Placement:
    """The cells of a fleet, any degradation, and the per-rack capacity each pool was distributed over."""

    cells: tuple[Cell, ...]
    issues: tuple[PlacementIssue, ...] = ()
    capacity: Mapping[str, Mapping[str, int]] = field(default_factory=dict, hash=False)

    def pool_cells(self, pool: str) -> tuple[Cell, ...]:
        """The cells of `pool`, in rack order."""
        return tuple(cell for cell in self.cells if cell.pool == pool)

    def replicas(self, pool: str) -> int:
        """Replicas placed for `pool`."""
        return sum(cell.replicas for cell in self.pool_cells(pool))

    @property
    def degraded(self) -> bool:
        """Whether fewer replicas were placed than requested."""
        return bool(self.issues)


def distribute_replicas(pool_replicas: int, racks_with_capacity: Mapping[str, int]) -> dict[str, int]:
    """Deal `pool_replicas` round-robin over racks in sorted name order, never above a rack's capacity.

    Returns rack -> replicas for racks that got at least one; places fewer than asked when capacity runs out.
    Computed in closed form, O(racks x log(capacity)) whatever the replica count: after `rounds` full rounds of the
    deal every rack holds min(capacity, rounds); the last, partial round gives one more to the first open racks.
    """
    capacity = {rack: cap for rack, cap in sorted(racks_with_capacity.items()) if cap > 0}
    wanted = max(pool_replicas, 0)

    def dealt(rounds: int) -> int:
        return sum(min(cap, rounds) for cap in capacity.values())

    low, high = 0, max(capacity.values(), default=0)  # the most full rounds with dealt(rounds) <= wanted
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if dealt(middle) <= wanted else (low, middle - 1)
    counts = {rack: min(cap, low) for rack, cap in capacity.items()}
    remaining = wanted - dealt(low)
    for rack in [rack for rack, cap in capacity.items() if cap > low][:remaining]:
        counts[rack] += 1
    return {rack: count for rack, count in counts.items() if count > 0}


def node_fits(node: NodeInfo, pool: PoolSpec) -> bool:
    """Whether one replica of `pool` could run on `node`."""
    return (
        node.ready
        and node.schedulable
        and (pool.gpu_product is None or node.gpu_product == pool.gpu_product)
        and all(node.labels.get(key) == value for key, value in pool.node_selector.items())
        and all(taint.tolerated_by(pool.tolerations) for taint in node.blocking_taints())
        and node.gpu_allocatable >= pool.gpus_per_replica
    )


def _per_node(free_gpus: int, pool: PoolSpec) -> int:
    if pool.gpus_per_replica == 0:
        return UNBOUNDED_CAPACITY
    return free_gpus // pool.gpus_per_replica


def _requirements(pool_name: str, pool: PoolSpec, rack_label: str | None) -> str:
    needs = ["Ready", "schedulable", f">= {pool.gpus_per_replica} allocatable nvidia.com/gpu"]
    if pool.gpu_product:
        needs.append(f"GPU product {pool.gpu_product}")
    needs += [f"{key}={value}" for key, value in sorted(pool.node_selector.items())]
    if rack_label:
        needs.append(f"a {rack_label} label")
    return f"{pool_name} needs nodes that are " + ", ".join(needs) + " (and tolerates their NoSchedule taints)"


@dataclass
class _Rack:
    """Nodes of one rack and the GPUs still free on each while placing."""

    nodes: list[NodeInfo]
    free: dict[str, int]

    def capacity(self, pool: PoolSpec) -> int:
        return sum(_per_node(self.free[n.name], pool) for n in self.nodes if node_fits(n, pool))

    def take(self, pool: PoolSpec, replicas: int, spare: PoolSpec) -> None:
        """Reserve GPUs for `replicas` of `pool`, on nodes that do not fit `spare` first."""
        order = sorted((n for n in self.nodes if node_fits(n, pool)), key=lambda n: (node_fits(n, spare), n.name))
        for node in order:
            count = min(replicas, _per_node(self.free[node.name], pool))
            self.free[node.name] -= count * pool.gpus_per_replica
            replicas -= count

    def zone(self) -> str:
        zones = Counter(n.zone for n in self.nodes if n.zone)
        return min(zones, key=lambda z: (-zones[z], z)) if zones else ""


def _racks(spec: PDDeploymentSpec, nodes: list[NodeInfo]) -> dict[str, _Rack]:
    unconstrained = spec.topology.placement == "Unconstrained"
    grouped: dict[str, list[NodeInfo]] = {}
    for node in sorted(nodes, key=lambda n: n.name):
        key = ANY_RACK if unconstrained else node.rack
        if key is not None:
            grouped.setdefault(key, []).append(node)
    return {key: _Rack(members, {n.name: n.gpu_allocatable for n in members}) for key, members in grouped.items()}


def _check_matches(
    spec: PDDeploymentSpec, nodes: list[NodeInfo], racks: dict[str, _Rack], want: dict[str, int]
) -> None:
    for name in POOLS:
        pool = spec.pool(name)
        if want[name] == 0:
            continue
        if not any(node_fits(n, pool) for n in nodes):
            needs = _requirements(name, pool, None)
            raise PlacementError("NoMatchingNodes", f"no node fits the {name} pool (checked {len(nodes)}): {needs}")
        if not any(rack.capacity(pool) for rack in racks.values()):
            raise PlacementError(
                "NoRackLabel",
                f"nodes fit the {name} pool but none has the rack label: "
                f"{_requirements(name, pool, spec.topology.rack_label)}",
            )


def _shortfall(name: str, pool: PoolSpec, wanted: int, placed: int, capacity: Mapping[str, int]) -> PlacementIssue:
    room = ", ".join(f"{rack or 'cluster'}: {cap}" for rack, cap in sorted(capacity.items())) or "none"
    message = f"{name}: placed {placed} of {wanted} replicas ({pool.gpus_per_replica} GPU each); room per rack: {room}"
    if placed == 0:
        raise PlacementError("InsufficientCapacity", message)
    return PlacementIssue("InsufficientCapacity", message)


def plan_placement(
    spec: PDDeploymentSpec,
    nodes: list[NodeInfo],
    *,
    pdd_name: str,
    replicas: Mapping[str, int] | None = None,
) -> Placement:
    """Cells for `spec` on `nodes` (see the module docstring for the rules).

    `replicas` overrides the spec's replica count per pool (the autoscaler's decision). Raises PlacementError with
    reason NoMatchingNodes, NoRackLabel, RackWithoutDecode or InsufficientCapacity when a requested pool cannot get
    a single replica.
    """
    want = {name: (replicas or {}).get(name, spec.pool(name).replicas) for name in POOLS}
    prefill, decode = spec.prefill, spec.decode
    racks = _racks(spec, nodes)
    _check_matches(spec, nodes, racks, want)

    decode_racks = {key: rack.capacity(decode) for key, rack in racks.items()}
    if spec.topology.placement == "RackPaired":
        decode_racks = {key: cap for key, cap in decode_racks.items() if cap and racks[key].capacity(prefill)}
        if want["prefill"] and not want["decode"]:
            raise PlacementError(
                "RackWithoutDecode", "RackPaired placement needs decode replicas next to prefill (decode has 0)"
            )
        if any(want.values()) and not decode_racks:
            raise PlacementError(
                "RackWithoutDecode",
                "no rack has room for both a prefill and a decode replica: prefill fits "
                f"{_fitting(racks, prefill)}, decode fits {_fitting(racks, decode)}",
            )
    decode_counts = distribute_replicas(want["decode"], decode_racks)

    for key, count in decode_counts.items():
        racks[key].take(decode, count, spare=prefill)
    prefill_keys = decode_counts if spec.topology.placement == "RackPaired" else racks
    prefill_racks = {key: racks[key].capacity(prefill) for key in prefill_keys}
    prefill_counts = distribute_replicas(want["prefill"], prefill_racks)

    capacity = {"prefill": prefill_racks, "decode": decode_racks}
    counts = {"prefill": prefill_counts, "decode": decode_counts}
    issues = tuple(
        _shortfall(name, spec.pool(name), want[name], sum(counts[name].values()), capacity[name])
        for name in POOLS
        if sum(counts[name].values()) < want[name]
    )
    cells = tuple(
        Cell(pool=name, rack=key, zone=_zone(racks, key), replicas=count, name=cell_name(pdd_name, name, key))
        for name in POOLS
        for key, count in sorted(counts[name].items())
    )
    return Placement(cells=cells, issues=issues, capacity=capacity)


def _zone(racks: dict[str, _Rack], key: str) -> str:
    """Zone of a rack cell; an unconstrained cell's pods may land in any zone."""
    return "" if key == ANY_RACK else racks[key].zone()


def _fitting(racks: dict[str, _Rack], pool: PoolSpec) -> str:
    names = [key for key, rack in sorted(racks.items()) if rack.capacity(pool)]
    return ", ".join(names) or "no rack"
