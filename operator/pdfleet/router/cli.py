"""`pdfleet router`: run the rack-aware PD router for one PDDeployment."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from .service import RouterConfig, RouterService


def parse_args(argv: list[str]) -> RouterConfig:
    """Command line -> RouterConfig."""
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
    a = p.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
