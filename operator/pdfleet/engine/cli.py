"""`pdfleet engine serve <model> [vLLM args] [emulator args]`: run the vLLM-compatible engine emulator."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from pdfleet.engine.config import parse_serve_args

USAGE = "usage: pdfleet engine serve <model> [vLLM serve args] [--emulator-* args]  (see `serve --help`)"


def main(argv: list[str]) -> int:
    """Entry point of `pdfleet engine`; returns the process exit code."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] != "serve":
        print(f"pdfleet engine: unknown subcommand {argv[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    settings = parse_serve_args(argv[1:])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.ignored_args:
        logging.getLogger("pdfleet.engine").warning(
            "ignoring vLLM arguments the emulator does not model: %s", " ".join(settings.ignored_args)
        )
    from pdfleet.engine.server import engine_limits, serve

    try:
        engine_limits(settings)
    except ValueError as exc:
        print(f"pdfleet engine: {exc}", file=sys.stderr)
        return 1
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    # prometheus_client's *_created series stay on: vLLM 0.32 exports them too (one per counter and histogram)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(settings, stop=stop)

    asyncio.run(run())
    return 0
