"""`pdfleet operator`: run the Kopf operator (all namespaces, or the ones given)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

import kopf
from prometheus_client import REGISTRY, start_http_server

from pdfleet.cli.argtypes import CommandParser, port_or_zero, positive_int

log = logging.getLogger("pdfleet.operator")


def peering_priority(started_at: float, tiebreak: int) -> int:
    """The Kopf peering priority of a replica started at `started_at` (unix seconds).

    Kopf runs the replica of the highest priority and pauses the others; equal priorities pause them all. So every
    replica gets its own: the earlier started, the higher (the replica that runs keeps running, and one that starts or
    restarts joins as standby), `tiebreak` (0..999) separating replicas started in the same millisecond. Negative,
    hence below Kopf's default (0) and `kopf run --dev` (666): an operator started by hand in the same peering with
    either pauses the deployed replicas instead of fighting them.
    """
    return -(int(started_at * 1000) * 1000 + tiebreak % 1000)


def peering_options(
    name: str | None, priority: int | None, lifetime_s: int | None, started_at: float, tiebreak: int
) -> dict[str, Any]:
    """`kopf.operator` arguments for peering `name` (None: standalone): this replica's priority (the given one, else
    `peering_priority`) and the lifetime of its keep-alive record, after which peers count a silent replica as dead
    and the next one takes over (Kopf's default: 60 s)."""
    if name is None:
        return {"standalone": True, "peering_name": None}
    settings = kopf.OperatorSettings()
    if lifetime_s is not None:
        settings.peering.lifetime = lifetime_s
    return {
        "standalone": False,
        "peering_name": name,
        "priority": peering_priority(started_at, tiebreak) if priority is None else priority,
        "settings": settings,
    }


def main(argv: list[str]) -> int:
    parser = CommandParser(prog="pdfleet operator", description=__doc__)
    parser.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="watch only these namespaces (repeatable); default: all namespaces",
    )
    parser.add_argument(
        "--metrics-address",
        default="0.0.0.0",
        help="address the Prometheus metrics port listens on: all interfaces, so Prometheus can scrape the pod"
        " IP (unauthenticated: restrict it with a NetworkPolicy, or 127.0.0.1 behind a proxy; docs/security.md)",
    )
    parser.add_argument("--metrics-port", type=port_or_zero, default=9090, help="Prometheus metrics port (0 disables)")
    parser.add_argument(
        "--health-address",
        default="127.0.0.1:8080",
        help="host:port of the liveness endpoint /healthz (empty disables); in a pod use 0.0.0.0:<port>, which the"
        " kubelet's probe reaches on the pod IP",
    )
    parser.add_argument(
        "--peering",
        default=None,
        help="Kopf peering name: replicas sharing it elect one active operator; default standalone",
    )
    parser.add_argument(
        "--peering-priority",
        type=int,
        default=None,
        help="this replica's Kopf peering priority (the highest runs, the others stand by); default: from the start"
        " time, the earliest started replica highest, every replica distinct",
    )
    parser.add_argument(
        "--peering-lifetime",
        type=positive_int,
        default=None,
        metavar="SECONDS",
        help="how long peers count this replica alive after its last keep-alive: a killed active replica is replaced"
        " within about this long; default Kopf's 60",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="log debug messages")
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    import pdfleet.autoscale.handlers
    import pdfleet.reconcile.handlers
    from pdfleet.operator.fleet_metrics import FleetStateCollector

    REGISTRY.register(FleetStateCollector(lambda: list(pdfleet.reconcile.handlers.FLEETS.values())))
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.metrics_address)
    liveness = f"http://{args.health_address}/healthz" if args.health_address else None
    peering = peering_options(
        args.peering, args.peering_priority, args.peering_lifetime, time.time(), random.randrange(1000)
    )
    if args.peering is not None:
        log.info("peering %r with priority %d", args.peering, peering["priority"])
    asyncio.run(
        kopf.operator(
            **peering,
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            liveness_endpoint=liveness,
        )
    )
    return 0
