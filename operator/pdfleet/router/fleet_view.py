"""The fleet view (docs/architecture.md, "Fleet view"): what the operator tells the router, as frozen values."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import urlsplit

from pdfleet import POOLS

LOCALITIES = ("required", "preferred", "any")


class FleetViewError(ValueError):
    """The fleet view JSON does not match the contract."""


@dataclass(frozen=True)
class RoutingPolicy:
    """`spec.router.policy` of the PDDeployment, as carried in the fleet view."""

    locality: str = "preferred"
    disaggregate_min_prompt_tokens: int = 256
    prefix_affinity: bool = True
    prefix_block_tokens: int = 64
    max_prefill_retries: int = 2
    max_decode_retries: int = 2
    prefill_timeout_seconds: float = 60.0
    decode_timeout_seconds: float = 600.0
    # the operator derives these two from the SLA (render.fleet_view.leg_timeouts); the defaults are the values of
    # the default SLA (ttftMs 500, tpotMs 50), and a view leaves them out when they are equal to these
    first_byte_timeout_seconds: float = 12.0  # an upstream's first body byte (prefill, decode, direct legs)
    inter_chunk_timeout_seconds: float = 5.0  # the longest a decode may fall silent once its reply started


@dataclass(frozen=True)
class EndpointSpec:
    """One Ready engine pod as listed by the operator."""

    name: str
    pool: str
    url: str
    rack: str = ""
    zone: str = ""
    draining: bool = False
    host: str = field(default="", compare=False)
    port: int = field(default=0, compare=False)


@dataclass(frozen=True)
class FleetView:
    """A whole fleet view: policy plus the endpoints of both pools."""

    version: int
    generation: int
    model: str
    policy: RoutingPolicy
    endpoints: tuple[EndpointSpec, ...]
    revision: int = 0  # the operator's content revision; 0: unordered (a hand-written view)

    def older_than(self, other: FleetView | None) -> bool:
        """A view that must not replace `other`: both revised by the operator and this one older by (generation,
        revision). The generation first, so a PDDeployment whose status (and revision count) was lost recovers at
        its next spec change."""
        if other is None or not self.revision or not other.revision:
            return False
        return (self.generation, self.revision) < (other.generation, other.revision)

    def pool(self, pool: str) -> tuple[EndpointSpec, ...]:
        """Endpoints of one pool, in view order."""
        return tuple(e for e in self.endpoints if e.pool == pool)


# camelCase wire name -> (python field, type); the one table both directions use
_POLICY_FIELDS: dict[str, tuple[str, type]] = {
    "locality": ("locality", str),
    "disaggregateMinPromptTokens": ("disaggregate_min_prompt_tokens", int),
    "prefixAffinity": ("prefix_affinity", bool),
    "prefixBlockTokens": ("prefix_block_tokens", int),
    "maxPrefillRetries": ("max_prefill_retries", int),
    "maxDecodeRetries": ("max_decode_retries", int),
    "prefillTimeoutSeconds": ("prefill_timeout_seconds", float),
    "decodeTimeoutSeconds": ("decode_timeout_seconds", float),
    "firstByteTimeoutSeconds": ("first_byte_timeout_seconds", float),
    "interChunkTimeoutSeconds": ("inter_chunk_timeout_seconds", float),
}
# optional on the wire: written only when they differ from the router's defaults (as the operator renders them)
_SPARSE_POLICY_FIELDS = frozenset({"firstByteTimeoutSeconds", "interChunkTimeoutSeconds"})
_DEFAULT_POLICY = RoutingPolicy()


def _typed(value: Any, kind: type, what: str) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            raise FleetViewError(f"{what} must be a boolean, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise FleetViewError(f"{what} must be a {kind.__name__}, got {value!r}")
    return kind(value)


def parse_policy(raw: Mapping[str, Any] | None) -> RoutingPolicy:
    """Parse the `policy` object; missing fields take the CRD defaults."""
    if raw is None:
        return RoutingPolicy()
    if not isinstance(raw, Mapping):
        raise FleetViewError("policy must be an object")
    values: dict[str, Any] = {}
    for wire, (attr, kind) in _POLICY_FIELDS.items():
        if wire in raw and raw[wire] is not None:
            values[attr] = raw[wire] if kind is str else _typed(raw[wire], kind, f"policy.{wire}")
    policy = RoutingPolicy(**values)
    if policy.locality not in LOCALITIES:
        raise FleetViewError(f"policy.locality must be one of {LOCALITIES}, got {policy.locality!r}")
    if policy.prefix_block_tokens < 1:
        raise FleetViewError("policy.prefixBlockTokens must be >= 1")
    for attr in ("max_prefill_retries", "max_decode_retries", "disaggregate_min_prompt_tokens"):
        if getattr(policy, attr) < 0:
            raise FleetViewError(f"policy {attr} must be >= 0")
    timeouts = (
        policy.prefill_timeout_seconds,
        policy.decode_timeout_seconds,
        policy.first_byte_timeout_seconds,
        policy.inter_chunk_timeout_seconds,
    )
    if min(timeouts) <= 0:
        raise FleetViewError("policy timeouts must be > 0")
    return policy


def parse_endpoint(raw: Mapping[str, Any], index: int) -> EndpointSpec:
    """Parse one `endpoints[i]` entry; the URL must be http://host:port."""
    if not isinstance(raw, Mapping):
        raise FleetViewError(f"endpoints[{index}] must be an object")
    name, pool, url = raw.get("name"), raw.get("pool"), raw.get("url")
    if not isinstance(name, str) or not name:
        raise FleetViewError(f"endpoints[{index}].name must be a non-empty string")
    if pool not in POOLS:
        raise FleetViewError(f"endpoints[{index}].pool must be one of {POOLS}, got {pool!r}")
    if not isinstance(url, str):
        raise FleetViewError(f"endpoints[{index}].url must be a string")
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise FleetViewError(f"endpoints[{index}].url must be http://host[:port], got {url!r}")
    draining = raw.get("draining", False)
    if not isinstance(draining, bool):
        raise FleetViewError(f"endpoints[{index}].draining must be a boolean")
    return EndpointSpec(
        name=name,
        pool=pool,
        url=url.rstrip("/"),
        rack=str(raw.get("rack") or ""),
        zone=str(raw.get("zone") or ""),
        draining=draining,
        host=parts.hostname,
        port=parts.port or 80,
    )


def parse_fleet_view(raw: Mapping[str, Any]) -> FleetView:
    """Parse a decoded fleet-view JSON object into a FleetView, or raise FleetViewError."""
    if not isinstance(raw, Mapping):
        raise FleetViewError("fleet view must be a JSON object")
    endpoints_raw = raw.get("endpoints", [])
    if not isinstance(endpoints_raw, list):
        raise FleetViewError("endpoints must be a list")
    endpoints = tuple(parse_endpoint(e, i) for i, e in enumerate(endpoints_raw))
    names = [e.name for e in endpoints]
    if len(set(names)) != len(names):
        raise FleetViewError("endpoint names must be unique")
    return FleetView(
        version=_typed(raw.get("version", 1), int, "version"),
        generation=_typed(raw.get("generation", 0), int, "generation"),
        model=str(raw.get("model") or ""),
        policy=parse_policy(raw.get("policy")),
        endpoints=endpoints,
        revision=_typed(raw.get("revision", 0), int, "revision"),
    )


def load_fleet_view(data: bytes | str) -> FleetView:
    """Decode JSON text and parse it as a fleet view."""
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise FleetViewError(f"fleet view is not valid JSON: {exc}") from exc
    return parse_fleet_view(raw)


def fleet_view_to_dict(view: FleetView) -> dict[str, Any]:
    """The wire form of a FleetView (inverse of parse_fleet_view)."""
    return {
        "version": view.version,
        "generation": view.generation,
        "revision": view.revision,
        "model": view.model,
        "policy": {
            wire: getattr(view.policy, attr)
            for wire, (attr, _) in _POLICY_FIELDS.items()
            if wire not in _SPARSE_POLICY_FIELDS or getattr(view.policy, attr) != getattr(_DEFAULT_POLICY, attr)
        },
        "endpoints": [
            {"name": e.name, "pool": e.pool, "url": e.url, "rack": e.rack, "zone": e.zone, "draining": e.draining}
            for e in view.endpoints
        ],
    }
