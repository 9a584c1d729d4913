"""Thin HTTP adapter to the router replicas' admin API: their endpoint views (for drains), fleet-view sync (push, read
back, repair), and the per-PDDeployment admin token every call carries.

Pushing makes a new fleet view take effect at once; the mounted ConfigMap file reaches the router only after the
kubelet's sync period (up to about a minute), which would hold back new replicas and drains that long.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from pdfleet.cluster.kube import KubeClient
from pdfleet.cluster.observed import PodState
from pdfleet.render.fleet_view import pod_url
from pdfleet.render.meta import ROUTER_COMPONENT, Owner
from pdfleet.render.router_access import (
    ADMIN_TOKEN_KEY,
    admin_headers,
    admin_secret_name,
    render_router_admin_secret,
)

ROUTER_TIMEOUT_SECONDS = 2.0
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # pod IPs never go through a proxy

# What to do about one router's fleet view (router_view_action)
KEEP, PUSH, WAIT, REPLACE = "keep", "push", "wait", "replace"


def router_admin_urls(pods: Iterable[PodState], admin_port: int, *, ready_only: bool) -> dict[str, str]:
    """{pod name: admin base URL} of the router pods with an address that are not terminating; `ready_only` keeps
    the Ready ones. A router is Ready only once its view lists a healthy decode, so a push must not wait for it."""
    urls = {}
    for pod in pods:
        if pod.component != ROUTER_COMPONENT or not pod.ip or pod.terminating or (ready_only and not pod.ready):
            continue
        urls[pod.name] = pod_url(pod.ip, admin_port)
    return urls


def _view_key(view: Mapping[str, Any]) -> tuple[int, int]:
    return int(view.get("generation") or 0), int(view.get("revision") or 0)


def router_view_action(
    desired: Mapping[str, Any], observed: Mapping[str, Any] | None, newest_written: tuple[int, int]
) -> str:
    """KEEP: the router runs `desired`. PUSH: it runs none, an older one, or other content at the same (generation,
    revision): an ordinary PUT replaces it. WAIT: it runs a newer view this operator wrote (this plan came from a
    status a moment old); the next reconcile supersedes it. REPLACE: it runs a view newer than any the operator wrote,
    so someone else wrote it: replace it regardless of order, and report it."""
    if observed is None:
        return PUSH
    if observed == json.loads(json.dumps(desired)):  # the router answers the view's wire form; numbers compare by value
        return KEEP
    key = _view_key(observed)
    if key <= _view_key(desired):
        return PUSH
    return WAIT if key <= newest_written else REPLACE


@dataclass
class SyncResult:
    """One fleet-view sync over the routers."""

    in_sync: list[str] = field(default_factory=list)  # run the desired view (or a newer one of this operator)
    repaired: list[str] = field(default_factory=list)  # ran a view the operator did not write; replaced
    failures: list[str] = field(default_factory=list)  # "name: error" lines
    unauthorized: bool = False  # a router refused the token (the Secret changed): read it again


def _request(url: str, token: str, method: str = "GET", body: bytes | None = None) -> bytes:
    headers = admin_headers(token)
    if body is not None:
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    with _OPENER.open(request, timeout=ROUTER_TIMEOUT_SECONDS) as response:
        return response.read()


def _observed_view(url: str, token: str) -> dict[str, Any] | None:
    try:
        return json.loads(_request(url + "/admin/fleet", token))
    except urllib.error.HTTPError as exc:
        if exc.code == 404:  # no view loaded yet
            return None
        raise


def sync_fleet_view(
    routers: Mapping[str, str], view: Mapping[str, Any], token: str, newest_written: tuple[int, int]
) -> SyncResult:
    """Read each router's view back and act on it (router_view_action): nothing, PUT /admin/fleet, or PUT
    /admin/fleet/replace. A PUT refused as older (409) means someone wrote a newer view meanwhile: replaced too."""
    body = json.dumps(view).encode()
    result = SyncResult()
    for name, url in routers.items():
        try:
            action = router_view_action(view, _observed_view(url, token), newest_written)
            if action == PUSH:
                try:
                    _request(url + "/admin/fleet", token, "PUT", body)
                except urllib.error.HTTPError as exc:
                    if exc.code != 409:
                        raise
                    action = REPLACE
            if action == REPLACE:
                _request(url + "/admin/fleet/replace", token, "PUT", body)
                result.repaired.append(name)
            else:
                result.in_sync.append(name)
        except urllib.error.HTTPError as exc:
            result.unauthorized |= exc.code == 401
            result.failures.append(f"{name}: HTTP {exc.code}")
        except (OSError, ValueError) as exc:
            result.failures.append(f"{name}: {exc}")
    return result


def endpoint_views(urls: Iterable[str], token: str) -> list[list[dict] | None]:
    """Each router's /admin/endpoints list; None for a router that did not answer."""
    views: list[list[dict] | None] = []
    for url in urls:
        try:
            views.append(json.loads(_request(url + "/admin/endpoints", token))["endpoints"])
        except (OSError, ValueError, KeyError):
            views.append(None)
    return views


def _decoded_token(secret: Mapping[str, Any]) -> str | None:
    try:
        return base64.b64decode((secret.get("data") or {}).get(ADMIN_TOKEN_KEY) or "").decode() or None
    except (binascii.Error, UnicodeDecodeError):
        return None


class AdminTokens:
    """The admin token of each PDDeployment, from its Secret: read once and kept; created (random, owned by the
    PDDeployment, so it goes with it) when missing, never rotated by a reconcile. `forget` after a router refused it."""

    def __init__(self) -> None:
        self._tokens: dict[Owner, str] = {}

    def token(self, kube: KubeClient, pdd: Mapping[str, Any]) -> str:
        """The token of the routers of `pdd` (a PDDeployment as API JSON); reads or creates its Secret on first use."""
        owner = Owner.from_object(pdd)
        token = self._tokens.get(owner)
        if token is None:
            token = self._tokens[owner] = self._read_or_create(kube, owner)
        return token

    def forget(self, pdd: Mapping[str, Any]) -> None:
        """Read the Secret of `pdd` again on next use."""
        self._tokens.pop(Owner.from_object(pdd), None)

    @staticmethod
    def _read_or_create(kube: KubeClient, owner: Owner) -> str:
        name = admin_secret_name(owner.name)
        secret = kube.read_secret(owner.namespace, name)
        if secret is None:
            token = secrets.token_urlsafe(32)
            try:
                kube.create_secret(render_router_admin_secret(owner, token))
                return token
            except ApiException as exc:
                if exc.status != 409:  # another operator replica created it first: use theirs
                    raise
            secret = kube.read_secret(owner.namespace, name) or {}
        token = _decoded_token(secret)
        if token is None:
            raise ValueError(f"Secret {owner.namespace}/{name} has no usable {ADMIN_TOKEN_KEY!r} key")
        return token
