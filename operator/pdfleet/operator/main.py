"""`pdfleet operator`: run the Kopf operator (all namespaces, or the ones given)."""

from __future__ import annotations

import argparse
import asyncio
import logging

import kopf
from prometheus_client import REGISTRY, start_http_server


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="pdfleet operator", description=__doc__)
    parser.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="watch only these namespaces (repeatable); default: all namespaces",
    )
    parser.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port (0 disables)")
    parser.add_argument(
        "--health-address", default="0.0.0.0:8080", help="host:port of the liveness endpoint /healthz (empty disables)"
    )
    parser.add_argument(
        "--peering",
        default=None,
        help="Kopf peering name: replicas sharing it elect one active operator; default standalone",
    )
    parser.add_argument("--verbose", "-v", action="store_true")
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    import pdfleet.autoscale.handlers
    import pdfleet.reconcile.handlers
    from pdfleet.operator.fleet_metrics import FleetStateCollector

    REGISTRY.register(FleetStateCollector(lambda: list(pdfleet.reconcile.handlers.FLEETS.values())))
    if args.metrics_port:
        start_http_server(args.metrics_port, addr="0.0.0.0")
    liveness = f"http://{args.health_address}/healthz" if args.health_address else None
    asyncio.run(
        kopf.operator(
            standalone=args.peering is None,
            peering_name=args.peering,
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            liveness_endpoint=liveness,
        )
    )
    return 0
