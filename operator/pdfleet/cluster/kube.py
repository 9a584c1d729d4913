"""Thin adapter to the Kubernetes API: server-side apply, delete, list and API-version discovery.

Everything here is I/O; what to apply is decided by `pdfleet.render`. Every write goes through `KubeClient` so the
operator can count them (a no-op reconcile must make zero writes).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException
from prometheus_client import Counter

FIELD_MANAGER = "pdfleet-operator"
APPLIED_HASH_ANNOTATION = "pdfleet.dev/applied-hash"

API_WRITES = Counter(
    "pdfleet_operator_api_writes_total", "Kubernetes API write calls made by the operator", ["kind", "verb"]
)


@dataclass(frozen=True)
class ResourceType:
    """Where a kind lives in the REST API."""

    api_version: str
    plural: str
    namespaced: bool = True

    def collection_path(self, namespace: str | None) -> str:
        """URL path of the collection (namespaced when the kind is and a namespace is given)."""
        prefix = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            return f"{prefix}/namespaces/{namespace}/{self.plural}"
        return f"{prefix}/{self.plural}"


# Kinds the operator manages. PodDisruptionBudget's version is filled in by discovery (policy/v1 from 1.21).
CHILD_KINDS: dict[str, ResourceType] = {
    "StatefulSet": ResourceType("apps/v1", "statefulsets"),
    "Deployment": ResourceType("apps/v1", "deployments"),
    "Service": ResourceType("v1", "services"),
    "ConfigMap": ResourceType("v1", "configmaps"),
    "PodDisruptionBudget": ResourceType("policy/v1", "poddisruptionbudgets"),
    "NetworkPolicy": ResourceType("networking.k8s.io/v1", "networkpolicies"),
}
# The routers' admin token Secrets: read and created once, never applied, listed or deleted (the garbage collector
# removes them with their PDDeployment), so they are no child kind.
SECRETS = ResourceType("v1", "secrets")


def content_hash(obj: dict[str, Any]) -> str:
    """Stable hash of a rendered object, stored on it so an unchanged render is recognised without a write."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def with_applied_hash(obj: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of `obj` whose metadata carries the hash of its own content."""
    digest = content_hash(obj)
    meta = dict(obj.get("metadata", {}))
    meta["annotations"] = {**meta.get("annotations", {}), APPLIED_HASH_ANNOTATION: digest}
    return {**obj, "metadata": meta}


def load_api_client(kubeconfig: str | None = None) -> kubernetes.client.ApiClient:
    """In-cluster config when running in a pod, else the given (or $KUBECONFIG / default) kubeconfig."""
    configuration = kubernetes.client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    else:
        kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return kubernetes.client.ApiClient(configuration)


class KubeClient:
    """Generic JSON access to the resources the operator reads and writes."""

    def __init__(self, api: kubernetes.client.ApiClient):
        self.api = api
        self.kinds = dict(CHILD_KINDS)

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list | None = None,
        content_type: str = "application/json",
    ) -> Any:
        method, url, headers, body, _ = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            body=body,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(method, url, header_params=headers, body=body, _request_timeout=30)
        response.read()
        text = response.data.decode() if response.data else ""
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=text, data=None)
        return json.loads(text) if text else None

    def discover_versions(self) -> None:
        """Pick the newest served version of kinds that moved between Kubernetes releases."""
        groups = self._call("GET", "/apis")
        served = {v["groupVersion"] for g in groups.get("groups", []) for v in g.get("versions", [])}
        if "policy/v1" not in served:
            self.kinds["PodDisruptionBudget"] = ResourceType("policy/v1beta1", "poddisruptionbudgets")

    def api_version_of(self, kind: str) -> str:
        """The API version discovered for `kind` (e.g. policy/v1beta1 PDBs on 1.20)."""
        return self.kinds[kind].api_version

    def list(self, kind: str, namespace: str | None, label_selector: str | None = None) -> list[dict]:
        """Objects of `kind` in `namespace` (all namespaces when None), optionally label-selected."""
        rt = self.kinds[kind]
        query = [("labelSelector", label_selector)] if label_selector else []
        return self._call("GET", rt.collection_path(namespace), query=query).get("items", [])

    def apply(self, obj: dict[str, Any]) -> dict:
        """Server-side apply `obj` (which must carry apiVersion/kind/metadata.name[/namespace])."""
        kind = obj["kind"]
        rt = self.kinds[kind]
        meta = obj["metadata"]
        path = f"{rt.collection_path(meta.get('namespace'))}/{meta['name']}"
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
        retries = 1  # an apply that creates races any other creator (e.g. another operator replica in a handover)
        while True:
            API_WRITES.labels(kind, "apply").inc()
            try:
                return self._call("PATCH", path, body=obj, query=query, content_type="application/apply-patch+yaml")
            except ApiException as exc:
                # The object now exists, so applying again is an ordinary, idempotent patch.
                if retries == 0 or exc.status != 409 or "AlreadyExists" not in (exc.body or ""):
                    raise
                retries -= 1

    def patch_custom(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        subresource: str = "",
    ) -> dict:
        """Merge-patch a custom object (or its `status` subresource)."""
        API_WRITES.labels(plural + (f"/{subresource}" if subresource else ""), "patch").inc()
        path = f"/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}" + (
            f"/{subresource}" if subresource else ""
        )
        return self._call("PATCH", path, body=patch, content_type="application/merge-patch+json")

    def patch_status(
        self, group: str, version: str, plural: str, namespace: str, name: str, status: dict[str, Any]
    ) -> dict:
        """Merge-patch the status subresource of a custom object."""
        return self.patch_custom(group, version, plural, namespace, name, {"status": status}, subresource="status")

    def read_secret(self, namespace: str, name: str) -> dict | None:
        """The Secret, or None when there is none."""
        try:
            return self._call("GET", f"{SECRETS.collection_path(namespace)}/{name}")
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create_secret(self, obj: dict[str, Any]) -> dict:
        """Create a Secret (409 when it exists: never overwritten)."""
        API_WRITES.labels("Secret", "create").inc()
        return self._call("POST", SECRETS.collection_path(obj["metadata"]["namespace"]), body=obj)

    def delete(self, kind: str, namespace: str | None, name: str) -> None:
        """Delete, letting the garbage collector remove dependents (pods of a StatefulSet) in the background."""
        rt = self.kinds[kind]
        API_WRITES.labels(kind, "delete").inc()
        try:
            self._call("DELETE", f"{rt.collection_path(namespace)}/{name}", body={"propagationPolicy": "Background"})
        except ApiException as exc:
            if exc.status != 404:
                raise
