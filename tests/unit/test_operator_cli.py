"""`pdfleet operator` listen addresses: the metrics and liveness servers bind where the flags say (docs/security.md)."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from prometheus_client import CollectorRegistry

from pdfleet.operator import main as operator_main


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What main() would start: the metrics server's (port, addr) and Kopf's keyword arguments; nothing runs."""
    seen: dict[str, Any] = {}

    def start_http_server(port: int, addr: str = "0.0.0.0") -> None:
        seen["metrics"] = (port, addr)

    async def operator(**kwargs: Any) -> None:
        seen["kopf"] = kwargs

    monkeypatch.setattr(operator_main, "start_http_server", start_http_server)
    monkeypatch.setattr(operator_main, "REGISTRY", CollectorRegistry())
    monkeypatch.setattr(kopf, "operator", operator)
    return seen


def test_metrics_bind_all_interfaces_for_prometheus_and_health_loopback_by_default(started: dict[str, Any]) -> None:
    assert operator_main.main([]) == 0
    assert started["metrics"] == (9090, "0.0.0.0")  # Prometheus scrapes the pod IP
    assert started["kopf"]["liveness_endpoint"] == "http://127.0.0.1:8080/healthz"  # the chart opens it explicitly


def test_listen_addresses_follow_the_flags(started: dict[str, Any]) -> None:
    argv = ["--metrics-address", "127.0.0.1", "--metrics-port", "9191", "--health-address", "10.1.2.3:8181"]
    assert operator_main.main(argv) == 0
    assert started["metrics"] == (9191, "127.0.0.1")
    assert started["kopf"]["liveness_endpoint"] == "http://10.1.2.3:8181/healthz"


def test_zero_port_and_empty_address_disable_the_servers(started: dict[str, Any]) -> None:
    assert operator_main.main(["--metrics-port", "0", "--health-address", ""]) == 0
    assert "metrics" not in started
    assert started["kopf"]["liveness_endpoint"] is None
