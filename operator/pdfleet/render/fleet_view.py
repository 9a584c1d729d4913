"""The fleet view (docs/architecture.md, "Fleet view"): the one builder of what the operator tells the router.

Endpoints from pod states, the revision rule and the JSON text live here, so the ConfigMap the kubelet syncs and
the view the operator PUTs to each router are the same document. The router's parser is `pdfleet.router.fleet_view`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from pdfleet import POOLS
from pdfleet.api.model import PDDeploymentSpec
from pdfleet.render.meta import LABEL_POOL, LABEL_RACK, LABEL_ZONE

FLEET_VIEW_VERSION = 1
# first-byte and inter-chunk timeouts of the router's legs, from the SLA unless spec.router.policy sets them
FIRST_BYTE_TTFT_MULTIPLE = 4
FIRST_BYTE_MARGIN_SECONDS = 10.0
INTER_CHUNK_TPOT_MULTIPLE = 20
INTER_CHUNK_FLOOR_SECONDS = 5.0
# the router assumes these when a view leaves the timeouts out (the default SLA's values, ttftMs 500 and tpotMs 50);
# the view carries them only when they differ, so a view of the default SLA reads as before
ROUTER_DEFAULT_LEG_TIMEOUTS = (12.0, 5.0)
_LEG_TIMEOUT_KEYS = ("firstByteTimeoutSeconds", "interChunkTimeoutSeconds")


def url_host(ip: str) -> str:
    """A pod IP as the host part of a URL (IPv6 in brackets)."""
    return f"[{ip}]" if ipaddress.ip_address(ip).version == 6 else ip


def pod_url(ip: str, port: int) -> str:
    """http://<pod IP>:<port>, IPv6 bracketed."""
    return f"http://{url_host(ip)}:{port}"


@dataclass(frozen=True)
class Endpoint:
    """One Ready engine pod as the router sees it."""

    name: str
    pool: str
    url: str
    rack: str
    zone: str
    draining: bool = False

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any], port: int, *, draining: bool = False) -> Endpoint:
        """The Endpoint of an engine pod (Kubernetes API JSON) serving on `port`; pool/rack/zone from its labels."""
        labels = pod["metadata"].get("labels") or {}
        return cls(
            name=pod["metadata"]["name"],
            pool=labels[LABEL_POOL],
            url=pod_url(pod["status"]["podIP"], port),
            rack=labels.get(LABEL_RACK, ""),
            zone=labels.get(LABEL_ZONE, ""),
            draining=draining,
        )


class EnginePod(Protocol):
    """What the fleet view needs of an observed pod (`pdfleet.cluster.observed.PodState` fits)."""

    name: str
    pool: str
    ip: str | None
    rack: str
    zone: str
    ready: bool
    terminating: bool


def fleet_endpoints(pods: Iterable[EnginePod], port: int, draining: Collection[str] = ()) -> list[Endpoint]:
    """Every Ready, addressed, not-terminating engine pod serving on `port`, as the router should see it;
    those named in `draining` flagged so."""
    return [
        Endpoint(
            name=p.name,
            pool=p.pool,
            url=pod_url(p.ip, port),
            rack=p.rack,
            zone=p.zone,
            draining=p.name in draining,
        )
        for p in sorted(pods, key=lambda p: p.name)
        if p.ready and p.ip and not p.terminating and p.pool in POOLS
    ]


def leg_timeouts(spec: PDDeploymentSpec) -> tuple[float, float]:
    """(first-byte, inter-chunk) timeouts of the router's legs in seconds: spec.router.policy's when set, else from
    the SLA: a few times ttftMs plus a margin (queueing, KV transfer), a multiple of tpotMs with a floor (a decode
    step under load, a preemption)."""
    policy, sla = spec.router.policy, spec.sla
    first_byte = policy.first_byte_timeout_seconds
    if first_byte is None:
        first_byte = FIRST_BYTE_TTFT_MULTIPLE * sla.ttft_ms / 1000 + FIRST_BYTE_MARGIN_SECONDS
    inter_chunk = policy.inter_chunk_timeout_seconds
    if inter_chunk is None:
        inter_chunk = max(INTER_CHUNK_FLOOR_SECONDS, INTER_CHUNK_TPOT_MULTIPLE * sla.tpot_ms / 1000)
    return float(first_byte), float(inter_chunk)


def render_policy(spec: PDDeploymentSpec) -> dict[str, Any]:
    """The view's `policy` object: spec.router.policy on the wire, with the leg timeouts resolved (and left out when
    they equal the router's defaults)."""
    policy = spec.router.policy.model_dump(
        by_alias=True, mode="json", exclude={"first_byte_timeout_seconds", "inter_chunk_timeout_seconds"}
    )
    for key, value, default in zip(_LEG_TIMEOUT_KEYS, leg_timeouts(spec), ROUTER_DEFAULT_LEG_TIMEOUTS):
        if value != default:
            policy[key] = value
    return policy


def render_fleet_view(spec: PDDeploymentSpec, generation: int, endpoints: Iterable[Endpoint]) -> dict[str, Any]:
    """The fleet.json document without its revision: model, routing policy and endpoints (sorted by pool, then
    name)."""
    return {
        "version": FLEET_VIEW_VERSION,
        "generation": generation,
        "model": spec.model.served_name,
        "policy": render_policy(spec),
        "endpoints": [asdict(ep) for ep in sorted(endpoints, key=lambda ep: (ep.pool, ep.name))],
    }


def fleet_view_revision(fleet_view: Mapping[str, Any], previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """status.fleetView for a view rendered without its revision: {"revision", "hash"}, the revision raised by one
    when the content differs from the previous record's. Routers take views by revision, so one pushed to them
    is not replaced by the older ConfigMap file the kubelet syncs later."""
    digest = hashlib.sha256(fleet_view_json(fleet_view).encode()).hexdigest()[:16]
    revision = int((previous or {}).get("revision") or 0)
    if (previous or {}).get("hash") != digest:
        revision += 1
    return {"revision": revision, "hash": digest}


def fleet_view_json(fleet_view: Mapping[str, Any]) -> str:
    """fleet.json text: sorted keys and fixed formatting, so an unchanged view is byte-identical."""
    return json.dumps(fleet_view, sort_keys=True, indent=2) + "\n"


@dataclass(frozen=True)
class BuiltFleetView:
    """A fleet view with its revision: `view` is what the ConfigMap and the push carry, `record` is status.fleetView."""

    view: dict[str, Any]
    record: dict[str, Any]

    @property
    def json(self) -> str:
        """The view as fleet.json text."""
        return fleet_view_json(self.view)


def build_fleet_view(
    spec: PDDeploymentSpec,
    generation: int,
    pods: Iterable[EnginePod],
    *,
    draining: Collection[str] = (),
    previous: Mapping[str, Any] | None = None,
) -> BuiltFleetView:
    """The fleet view of `spec` at `generation` over the engine pods, its revision carried on from `previous`
    (status.fleetView) and raised by one only when the content changed."""
    view = render_fleet_view(spec, generation, fleet_endpoints(pods, spec.engine.port, draining))
    record = fleet_view_revision(view, previous)
    return BuiltFleetView(view={**view, "revision": record["revision"]}, record=record)
