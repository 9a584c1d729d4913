"""Thin HTTP adapter to the router replicas' admin API: their endpoint views (for drains) and fleet-view pushes.

Pushing makes a new fleet view take effect at once; the mounted ConfigMap file reaches the router only after the
kubelet's sync period (up to about a minute), which would hold back new replicas and drains that long.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

from pdfleet.cluster.observed import PodState
from pdfleet.render.fleet_view import pod_url
from pdfleet.render.meta import ROUTER_COMPONENT

ROUTER_TIMEOUT_SECONDS = 2.0
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # pod IPs never go through a proxy


def router_admin_urls(pods: Iterable[PodState], admin_port: int, *, ready_only: bool) -> dict[str, str]:
    """{pod name: admin base URL} of the router pods with an address that are not terminating; `ready_only` keeps
    the Ready ones. A router is Ready only once its view lists a healthy decode, so a push must not wait for it."""
    urls = {}
    for pod in pods:
        if pod.component != ROUTER_COMPONENT or not pod.ip or pod.terminating or (ready_only and not pod.ready):
            continue
        urls[pod.name] = pod_url(pod.ip, admin_port)
    return urls


def endpoint_views(urls: Iterable[str]) -> list[list[dict] | None]:
    """Each router's /admin/endpoints list; None for a router that did not answer."""
    views: list[list[dict] | None] = []
    for url in urls:
        try:
            with _OPENER.open(url + "/admin/endpoints", timeout=ROUTER_TIMEOUT_SECONDS) as response:
                views.append(json.loads(response.read())["endpoints"])
        except (OSError, ValueError, KeyError):
            views.append(None)
    return views


def push_fleet_view(routers: Mapping[str, str], view: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """PUT the view to each router's /admin/fleet: (names that hold it or a newer one, "name: error" lines)."""
    body = json.dumps(view).encode()
    taken, failures = [], []
    for name, url in routers.items():
        request = urllib.request.Request(
            url + "/admin/fleet", data=body, method="PUT", headers={"Content-Type": "application/json"}
        )
        try:
            with _OPENER.open(request, timeout=ROUTER_TIMEOUT_SECONDS):
                taken.append(name)
        except urllib.error.HTTPError as exc:
            if exc.code == 409:  # the router already runs a newer view
                taken.append(name)
            else:
                failures.append(f"{name}: HTTP {exc.code}")
        except OSError as exc:
            failures.append(f"{name}: {exc}")
    return taken, failures
