"""Wiring of one router process: data and admin listeners, fleet-file watcher, health loop, graceful stop."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from .endpoints import TIMEOUT_HOLD_SECONDS, EndpointRegistry, health_loop
from .fleet_view import FleetView, FleetViewError, fleet_view_to_dict, load_fleet_view
from .handshake import error_body
from .httpserver import ClientConnection, Request, ServerLimits, serve, status_line
from .metrics import RouterMetrics
from .proxy import PDRouter

log = logging.getLogger("pdfleet.router")
_PROMETHEUS_TEXT = b"text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class RouterConfig:
    """Process settings (the routing policy itself comes with the fleet view)."""

    fleet_file: str | None = None
    host: str = "0.0.0.0"
    port: int = 8080
    admin_host: str | None = None  # default: same as host
    admin_port: int = 8081
    fleet_poll_seconds: float = 1.0
    health_interval_seconds: float = 2.0
    health_timeout_seconds: float = 2.0
    connect_timeout_seconds: float = 2.0
    shutdown_grace_seconds: float = 30.0
    limits: ServerLimits = field(default_factory=ServerLimits)  # client connections of both listeners
    timeout_hold_seconds: float = TIMEOUT_HOLD_SECONDS  # hold-out of an endpoint whose leg timed out
    admin_token_file: str | None = None  # the bearer token /admin/* requires, read at each admin request
    insecure_admin: bool = False  # without a token file: serve /admin/* to anyone (local experiments only)


class RouterService:
    """A running router: call `start()`, later `stop()`."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.registry = EndpointRegistry(config.connect_timeout_seconds, config.timeout_hold_seconds)
        self.metrics = RouterMetrics(self.registry.rows)
        self.router: PDRouter | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._fleet_bytes: bytes | None = None

    def apply_view(self, view: FleetView, *, replace: bool = False) -> bool:
        """Switch the fleet view, unless it is older than the one in use (a pushed view is newer than the mounted
        file until the kubelet syncs it) and not a `replace`; in-flight requests keep their endpoints. True if
        applied."""
        if not replace and view.older_than(self.registry.view):
            log.info(
                "ignoring fleet view revision %d: revision %d is in use",
                view.revision,
                self.registry.view.revision if self.registry.view else 0,
            )
            return False
        self.registry.apply(view)
        self.metrics.fleet_generation = view.generation
        self.metrics.fleet_reloads += 1
        log.info(
            "fleet view generation %d revision %d applied: %d prefill, %d decode",
            view.generation,
            view.revision,
            len(self.registry.prefills),
            len(self.registry.decodes),
        )
        return True

    def reload_fleet_file(self) -> bool:
        """Re-read the fleet file; apply it if its content changed and parses. True if a new view was applied."""
        path = self.config.fleet_file
        if path is None:
            return False
        try:
            data = Path(path).read_bytes()
        except OSError:
            return False
        if data == self._fleet_bytes:
            return False
        self._fleet_bytes = data
        try:
            view = load_fleet_view(data)
        except FleetViewError as exc:
            log.error("ignoring fleet file %s: %s", path, exc)
            return False
        return self.apply_view(view)

    async def start(self) -> None:
        """Load the fleet file if present, then listen and start background loops."""
        self.router = PDRouter(self.registry, self.metrics)
        self.reload_fleet_file()
        cfg = self.config
        if cfg.admin_token_file is None:
            log.warning("admin API %s", "open to anyone (--insecure-admin)" if cfg.insecure_admin else "disabled (403)")
        self._servers.append(await serve(self.router, cfg.host, cfg.port, cfg.limits))
        self._servers.append(await serve(AdminApp(self), cfg.admin_host or cfg.host, cfg.admin_port, cfg.limits))
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._watch_fleet_file()))
        self._tasks.append(
            loop.create_task(
                health_loop(self.registry, cfg.health_interval_seconds, cfg.health_timeout_seconds, self._stop)
            )
        )

    async def _watch_fleet_file(self) -> None:
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), self.config.fleet_poll_seconds)
            except asyncio.TimeoutError:
                self.reload_fleet_file()

    def inflight(self) -> int:
        """Requests in flight over all endpoints."""
        return sum(s.inflight for s in self.registry.all_states())

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (bounded by the grace period), close everything."""
        for server in self._servers:
            server.close()
        self._stop.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.shutdown_grace_seconds
        while self.inflight() and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.registry.close()


class AdminApp:
    """Admin port: /metrics, /health, /ready for anyone (Prometheus, the kubelet); /admin/fleet (GET, PUT),
    /admin/fleet/replace (PUT), /admin/endpoints (GET) only with `Authorization: Bearer <admin token>`."""

    def __init__(self, service: RouterService) -> None:
        self.service = service

    def _refusal(self, request: Request) -> tuple[int, str] | None:
        """Why an /admin/ request may not be served (status, message), or None. The token file is read each time,
        so a rewritten Secret takes effect without a restart."""
        cfg = self.service.config
        if cfg.admin_token_file is None:
            return None if cfg.insecure_admin else (403, "admin API disabled: the router has no --admin-token-file")
        try:
            token = Path(cfg.admin_token_file).read_bytes().strip()
        except OSError:
            log.error("admin token file %s unreadable: refusing admin requests", cfg.admin_token_file)
            return 503, "admin token unavailable"
        if not token:
            return 503, "admin token unavailable"
        if hmac.compare_digest(request.authorization or b"", b"Bearer " + token):
            return None
        log.warning("refused %s %s: missing or wrong admin token", request.method.decode(), request.path.decode())
        return 401, "missing or wrong admin bearer token"

    def handle(self, conn: ClientConnection, request: Request) -> None:
        """httpserver.Application."""
        method, path, registry = request.method, request.path, self.service.registry
        if path.startswith(b"/admin/"):
            refusal = self._refusal(request)
            if refusal is not None:
                status, message = refusal
                body = error_body(status, message)
                challenge = b"WWW-Authenticate: Bearer\r\n" if status == 401 else b""
                conn.write(
                    status_line(status)
                    + b"Content-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s" % (challenge, len(body), body)
                )
                conn.finish()
                return
        if path == b"/metrics":
            conn.respond(200, self.service.metrics.render(), _PROMETHEUS_TEXT)
        elif path == b"/health":
            conn.respond(200, b"{}")
        elif path == b"/ready":
            ready = registry.ready()
            conn.respond(200 if ready else 503, json.dumps({"ready": ready}).encode())
        elif path == b"/admin/endpoints" and method == b"GET":
            rows = [s.as_json() for s in registry.all_states()]
            conn.respond(200, json.dumps({"endpoints": rows}).encode())
        elif path == b"/admin/fleet" and method == b"GET":
            if registry.view is None:
                conn.respond(404, error_body(404, "no fleet view loaded"))
            else:
                conn.respond(200, json.dumps(fleet_view_to_dict(registry.view)).encode())
        elif path in (b"/admin/fleet", b"/admin/fleet/replace") and method == b"PUT":
            try:
                view = load_fleet_view(request.body)
            except FleetViewError as exc:
                conn.respond(400, error_body(400, str(exc)))
                return
            # replace: the token holder repairs a view it did not write, however new that one claims to be
            if not self.service.apply_view(view, replace=path == b"/admin/fleet/replace"):
                current = registry.view.revision if registry.view else 0
                conn.respond(409, error_body(409, f"fleet view revision {view.revision} is older than {current}"))
                return
            conn.respond(200, json.dumps({"generation": view.generation, "revision": view.revision}).encode())
        else:
            conn.respond(404, error_body(404, f"no route for {method.decode()} {path.decode()}"))
