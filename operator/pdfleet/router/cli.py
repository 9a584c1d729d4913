"""`pdfleet router`: run the rack-aware PD router for one PDDeployment."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from dataclasses import dataclass, field

from . import httpserver
from .endpoints import TIMEOUT_HOLD_SECONDS
from .httpserver import ServerLimits
from .service import RouterConfig, RouterService


@dataclass(frozen=True)
class Hardening:
    """Limits of the client connections on both ports, and the hold-out of an endpoint whose leg timed out."""

    limits: ServerLimits = field(default_factory=ServerLimits)
    timeout_hold_seconds: float = TIMEOUT_HOLD_SECONDS


def _positive(kind: type) -> object:
    def parse(text: str) -> object:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def parse_args(argv: list[str]) -> RouterConfig:
    """Command line -> RouterConfig."""
    return parse_command_line(argv)[0]


def parse_command_line(argv: list[str]) -> tuple[RouterConfig, Hardening]:
    """Command line -> RouterConfig and the hardening settings (limits, timeout hold-out)."""
    p = argparse.ArgumentParser(prog="pdfleet router", description="OpenAI-compatible rack-aware PD router")
    p.add_argument(
        "--fleet-file", default=None, help="fleet view JSON, re-read when it changes (also PUT /admin/fleet)"
    )
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--admin-host", default=None, help="admin listener address (default: --host)")
    p.add_argument("--admin-port", type=int, default=8081)
    p.add_argument("--fleet-poll-seconds", type=float, default=1.0)
    p.add_argument("--health-interval", type=float, default=2.0, help="seconds between GET /health rounds")
    p.add_argument("--health-timeout", type=float, default=2.0)
    p.add_argument("--connect-timeout", type=float, default=2.0)
    p.add_argument("--shutdown-grace", type=float, default=30.0, help="seconds to let in-flight requests finish")
    p.add_argument("--log-level", default="info")
    d = ServerLimits()
    limits = p.add_argument_group("client limits (data and admin ports)")
    limits.add_argument(
        "--max-body-bytes", type=_positive(int), default=d.max_body_bytes, help="larger request bodies get 413"
    )
    limits.add_argument(
        "--max-header-bytes", type=_positive(int), default=d.max_header_bytes, help="larger header blocks get 431"
    )
    limits.add_argument(
        "--max-request-line-bytes",
        type=_positive(int),
        default=d.max_request_line_bytes,
        help="longer request targets get 414",
    )
    limits.add_argument(
        "--header-timeout",
        type=_positive(float),
        default=d.header_timeout_seconds,
        help="seconds from a request's first byte (or the connection's opening) to the end of its head (408)",
    )
    limits.add_argument(
        "--body-timeout",
        type=_positive(float),
        default=d.body_timeout_seconds,
        help="seconds from the end of a request's head to the end of its body (408)",
    )
    limits.add_argument(
        "--idle-timeout",
        type=_positive(float),
        default=d.idle_timeout_seconds,
        help="seconds a kept-alive connection may wait for its next request",
    )
    p.add_argument(
        "--timeout-hold-seconds",
        type=_positive(float),
        default=TIMEOUT_HOLD_SECONDS,
        help="how long an endpoint whose leg missed its first-byte or inter-chunk timeout is kept out (doubled on "
        "each repeat, up to 16x), whatever its /health says",
    )
    a = p.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = RouterConfig(
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
    )
    limits_set = ServerLimits(
        max_body_bytes=a.max_body_bytes,
        max_header_bytes=a.max_header_bytes,
        max_request_line_bytes=a.max_request_line_bytes,
        header_timeout_seconds=a.header_timeout,
        body_timeout_seconds=a.body_timeout,
        idle_timeout_seconds=a.idle_timeout,
    )
    return config, Hardening(limits_set, a.timeout_hold_seconds)


async def run(config: RouterConfig, hardening: Hardening | None = None) -> None:
    """Run until SIGTERM/SIGINT, then stop gracefully."""
    hardening = hardening or Hardening()
    httpserver.set_default_limits(hardening.limits)  # both listeners RouterService.start opens
    service = RouterService(config)
    service.registry.timeout_hold_seconds = hardening.timeout_hold_seconds
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
    config, hardening = parse_command_line(argv)
    try:
        import uvloop
    except ImportError:  # uvloop is a hard dependency on Linux; plain asyncio keeps other platforms working
        asyncio.run(run(config, hardening))
    else:
        uvloop.run(run(config, hardening))
    return 0
