"""Pure pieces of drain-safe scale-down: which pods a shrink removes, and whether their drain has finished.

The operator (lead) marks these pods `draining: true` in the fleet view, polls every router replica's
`GET /admin/endpoints`, and shrinks the cells once `drain_progress(...).done`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Mapping, Sequence


@dataclass(frozen=True)
class DrainProgress:
    """Whether the draining pods may be removed now, and why."""

    done: bool
    inflight: int  # requests still in flight on draining pods, summed over the routers that answered
    reason: str


def pods_removed(cells_before: Mapping[str, int], cells_after: Mapping[str, int]) -> list[str]:
    """Pods a change of cell sizes removes: a StatefulSet `<cell>` drops its highest ordinals `<cell>-<n>`."""
    removed: list[str] = []
    for cell, before in sorted(cells_before.items()):
        removed += [f"{cell}-{ordinal}" for ordinal in range(cells_after.get(cell, 0), before)]
    return removed


def drain_progress(
    router_views: Sequence[Sequence[Mapping[str, Any]] | None],
    draining: Collection[str],
    started_at: float,
    now: float,
    timeout_s: float,
) -> DrainProgress:
    """Drain state from each router replica's /admin/endpoints list (None: that router did not answer).

    Done when every router answered, none still routes new work to a draining pod (listed with draining false), and
    their in-flight requests sum to 0; or when `timeout_s` has passed since `started_at`.
    """
    inflight, silent, unaware = 0, 0, set()
    for view in router_views:
        if view is None:
            silent += 1
            continue
        for endpoint in view:
            if endpoint.get("name") in draining:
                inflight += int(endpoint.get("inflight", 0))
                if not endpoint.get("draining", False):
                    unaware.add(endpoint["name"])
    waited = now - started_at
    if silent == 0 and not unaware and inflight == 0:
        return DrainProgress(True, 0, f"{len(draining)} pods drained after {waited:.0f} s")
    if waited >= timeout_s:
        reason = f"drain timeout {timeout_s:g} s reached with {inflight} requests in flight"
        return DrainProgress(True, inflight, reason)
    waiting_on = [f"{inflight} requests in flight"]
    if silent:
        waiting_on.append(f"{silent} routers not answering")
    if unaware:
        waiting_on.append(f"not yet draining on a router: {', '.join(sorted(unaware))}")
    return DrainProgress(False, inflight, "waiting: " + "; ".join(waiting_on))
