"""Who may use a router's admin port: the per-PDDeployment admin token Secret, and the NetworkPolicy that admits the
admin port only from the operator's pods (and the namespaces that scrape the router's /metrics) while the data port
stays open (docs/security.md)."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pdfleet.api.model import PDDeploymentSpec
from pdfleet.render.meta import ROUTER_COMPONENT, Owner, component_labels, object_meta, selector_labels
from pdfleet.topology.names import router_name

ADMIN_TOKEN_KEY = "token"
ADMIN_TOKEN_DIR = "/var/run/pdfleet/admin"
ADMIN_TOKEN_FILE = f"{ADMIN_TOKEN_DIR}/{ADMIN_TOKEN_KEY}"
# the chart's selector labels of the operator's pods (charts/pdfleet/templates/_helpers.tpl)
DEFAULT_OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "pdfleet-operator", "app.kubernetes.io/component": "operator"}
# operator settings (the chart sets them): where the operator's pods run, their labels, who scrapes router metrics
OPERATOR_NAMESPACE_ENV = "PDFLEET_OPERATOR_NAMESPACE"
OPERATOR_POD_LABELS_ENV = "PDFLEET_OPERATOR_POD_LABELS"
METRICS_NAMESPACES_ENV = "PDFLEET_ROUTER_METRICS_NAMESPACES"


def admin_secret_name(pdd_name: str) -> str:
    """Secret `<pdd>-router-admin`: the routers' admin token."""
    return f"{router_name(pdd_name)}-admin"


def admin_headers(token: str) -> dict[str, str]:
    """The header an admin client sends the router with the admin token (`Authorization: Bearer <token>`)."""
    return {"Authorization": f"Bearer {token}"}


def render_router_admin_secret(owner: Owner, token: str) -> dict[str, Any]:
    """The admin token Secret (key `token`), owned by the PDDeployment so it is deleted with it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": object_meta(owner, admin_secret_name(owner.name), component_labels(owner.name, ROUTER_COMPONENT)),
        "data": {ADMIN_TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


@dataclass(frozen=True)
class AdminClients:
    """Who may reach a router's admin port: the operator's pods (by labels, in `operator_namespace`; any namespace
    when None, e.g. an operator run outside the cluster), and every pod of `metrics_namespaces` (Prometheus scrapes
    /metrics there; /admin/ still wants the token)."""

    operator_namespace: str | None = None
    operator_labels: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_OPERATOR_POD_LABELS))
    metrics_namespaces: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AdminClients:
        """From the operator's settings: namespace, `k=v,k=v` pod labels, comma-separated metrics namespaces."""
        labels_text = env.get(OPERATOR_POD_LABELS_ENV, "").strip()
        labels = dict(DEFAULT_OPERATOR_POD_LABELS)
        if labels_text:
            pairs = [item.partition("=") for item in labels_text.split(",") if item.strip()]
            if any(not sep or not key.strip() for key, sep, _ in pairs):
                raise ValueError(f"{OPERATOR_POD_LABELS_ENV} must be k=v[,k=v...], got {labels_text!r}")
            labels = {key.strip(): value.strip() for key, _, value in pairs}
        namespaces = tuple(n.strip() for n in env.get(METRICS_NAMESPACES_ENV, "").split(",") if n.strip())
        return cls(env.get(OPERATOR_NAMESPACE_ENV) or None, labels, namespaces)


def _namespace_selector(namespace: str) -> dict[str, Any]:
    return {"matchLabels": {"kubernetes.io/metadata.name": namespace}}


def render_router_network_policy(owner: Owner, spec: PDDeploymentSpec, clients: AdminClients) -> dict[str, Any]:
    """NetworkPolicy `<pdd>-router` over the router pods: the data port from anywhere, the admin port only from the
    operator's pods and the metrics namespaces. (The kubelet's probes come from the node, which policies admit.)"""
    operator_peer: dict[str, Any] = {"podSelector": {"matchLabels": dict(clients.operator_labels)}}
    operator_peer["namespaceSelector"] = (
        _namespace_selector(clients.operator_namespace) if clients.operator_namespace else {}
    )
    admin_peers = [operator_peer] + [{"namespaceSelector": _namespace_selector(n)} for n in clients.metrics_namespaces]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(owner, router_name(owner.name), component_labels(owner.name, ROUTER_COMPONENT)),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(owner.name, ROUTER_COMPONENT)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"protocol": "TCP", "port": spec.router.port}]},
                {"from": admin_peers, "ports": [{"protocol": "TCP", "port": spec.router.admin_port}]},
            ],
        },
    }
