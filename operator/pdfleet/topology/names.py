"""Names of the objects a PDDeployment owns (cells, per-pool and router objects), valid as Kubernetes names."""

from __future__ import annotations

import hashlib
import re

# StatefulSet pods get "-<ordinal>" and a controller-revision-hash label "<sts>-<hash>" (<= 63): keep 52 for cells.
CELL_NAME_MAX = 52
HASH_LENGTH = 8


def dns_label_part(text: str) -> str:
    """`text` lowercased with every run of characters outside [a-z0-9] replaced by one '-', trimmed of '-'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def bounded_name(base: str, unique_key: str, max_length: int, exact: bool = True) -> str:
    """`base` if it is `exact` (nothing was lost making it) and fits `max_length`; otherwise base truncated plus a hash
    of `unique_key`, so distinct keys keep distinct names."""
    if exact and len(base) <= max_length:
        return base
    digest = hashlib.sha256(unique_key.encode()).hexdigest()[:HASH_LENGTH]
    return f"{base[: max_length - HASH_LENGTH - 1].rstrip('-')}-{digest}"


def cell_name(pdd: str, pool: str, rack: str) -> str:
    """StatefulSet (and headless Service) name of the (pool, rack) cell: `<pdd>-<pool>-<rack>`.

    The rack is sanitized to DNS-1123; when that changes it, or the name would exceed 52 characters, a hash of the
    original rack keeps names unique. Unconstrained placement has one cell per pool with rack "" -> `<pdd>-<pool>-any`.
    """
    part = dns_label_part(rack) if rack else "any"
    exact = part == rack or not rack
    return bounded_name(f"{pdd}-{pool}-{part}", f"{pdd}/{pool}/{rack}", CELL_NAME_MAX, exact)


def pool_name(pdd: str, pool: str) -> str:
    """Name of the pool's ClusterIP Service and PodDisruptionBudget: `<pdd>-<pool>`."""
    return f"{pdd}-{pool}"


def router_name(pdd: str) -> str:
    """Name of the router Deployment, Service and fleet-view ConfigMap: `<pdd>-router`."""
    return f"{pdd}-router"
