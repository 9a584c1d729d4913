"""`pdfleet router`: run the rack-aware PD router for one PDDeployment."""

from __future__ import annotations

import asyncio
import logging
import signal

from pdfleet.cli.argtypes import CommandParser, port, positive_float, positive_int

from .endpoints import TIMEOUT_HOLD_SECONDS
from .httpserver import ServerLimits
from .service import RouterConfig, RouterService


def parse_args(argv: list[str]) -> RouterConfig:
    """Command line -> RouterConfig (process settings, client limits, timeout hold-out, admin token)."""
    p = CommandParser(prog="pdfleet router", description="OpenAI-compatible rack-aware PD router")
    p.add_argument(
        "--fleet-file", default=None, help="fleet view JSON, re-read when it changes (also PUT /admin/fleet)"
    )
    p.add_argument("--host", default="0.0.0.0", help="address the OpenAI API listens on")
    p.add_argument("--port", type=port, default=8080, help="OpenAI API port")
    p.add_argument("--admin-host", default=None, help="admin listener address (default: --host)")
    p.add_argument("--admin-port", type=port, default=8081, help="admin port: /metrics, /admin/fleet, /health")
    p.add_argument(
        "--fleet-poll-seconds", type=positive_float, default=1.0, help="seconds between checks of --fleet-file"
    )
    p.add_argument("--health-interval", type=positive_float, default=2.0, help="seconds between GET /health rounds")
    p.add_argument("--health-timeout", type=positive_float, default=2.0, help="seconds one engine GET /health may take")
    p.add_argument("--connect-timeout", type=positive_float, default=2.0, help="seconds to connect to an engine")
    p.add_argument(
        "--shutdown-grace", type=positive_float, default=30.0, help="seconds to let in-flight requests finish"
    )
    p.add_argument(
        "--log-level",
        type=str.lower,
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="log messages from this level",
    )
    admin = p.add_mutually_exclusive_group()
    admin.add_argument(
        "--admin-token-file",
        default=None,
        help="file holding the bearer token every /admin/ request must carry (re-read at each one); without it "
        "/admin/ answers 403",
    )
    admin.add_argument(
        "--insecure-admin",
        action="store_true",
        help="serve /admin/ without a token, to anyone who reaches the admin port (local experiments only)",
    )
    d = ServerLimits()
    limits = p.add_argument_group("client limits (data and admin ports)")
    limits.add_argument(
        "--max-body-bytes", type=positive_int, default=d.max_body_bytes, help="larger request bodies get 413"
    )
    limits.add_argument(
        "--max-header-bytes", type=positive_int, default=d.max_header_bytes, help="larger header blocks get 431"
    )
    limits.add_argument(
        "--max-request-line-bytes",
        type=positive_int,
        default=d.max_request_line_bytes,
        help="longer request targets get 414",
    )
    limits.add_argument(
        "--header-timeout",
        type=positive_float,
        default=d.header_timeout_seconds,
        help="seconds from a request's first byte (or the connection's opening) to the end of its head (408)",
    )
    limits.add_argument(
        "--body-timeout",
        type=positive_float,
        default=d.body_timeout_seconds,
        help="seconds from the end of a request's head to the end of its body (408)",
    )
    limits.add_argument(
        "--idle-timeout",
        type=positive_float,
        default=d.idle_timeout_seconds,
        help="seconds a kept-alive connection may wait for its next request",
    )
    p.add_argument(
        "--timeout-hold-seconds",
        type=positive_float,
        default=TIMEOUT_HOLD_SECONDS,
        help="how long an endpoint whose leg missed its first-byte or inter-chunk timeout is kept out (doubled on "
        "each repeat, up to 16x), whatever its /health says",
    )
    a = p.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    limits = ServerLimits(
        max_body_bytes=a.max_body_bytes,
        max_header_bytes=a.max_header_bytes,
        max_request_line_bytes=a.max_request_line_bytes,
        header_timeout_seconds=a.header_timeout,
        body_timeout_seconds=a.body_timeout,
        idle_timeout_seconds=a.idle_timeout,
    )
    return RouterConfig(
        fleet_file=a.fleet_file,
        host=a.host,
        port=a.port,
        admin_host=a.admin_host,
        admin_port=a.admin_port,
        fleet_poll_seconds=a.fleet_poll_seconds,
        health_interval_seconds=a.health_interval,
        health_timeout_seconds=a.health_timeout,
        connect_timeout_seconds=a.connect_timeout,
        shutdown_grace_seconds=a.shutdown_grace,
        limits=limits,
        timeout_hold_seconds=a.timeout_hold_seconds,
        admin_token_file=a.admin_token_file,
        insecure_admin=a.insecure_admin,
    )


async def run(config: RouterConfig) -> None:
    """Run until SIGTERM/SIGINT, then stop gracefully."""
    service = RouterService(config)
    await service.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    logging.getLogger("pdfleet.router").info(
        "router listening on %s:%d (admin %d)", config.host, config.port, config.admin_port
    )
    await stop.wait()
    await service.stop()


def main(argv: list[str]) -> int:
    """Entry point for `pdfleet router`."""
    config = parse_args(argv)
    try:
        import uvloop
    except ImportError:  # uvloop is a hard dependency on Linux; plain asyncio keeps other platforms working
        asyncio.run(run(config))
    else:
        uvloop.run(run(config))
    return 0
