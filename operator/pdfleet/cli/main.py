"""`pdfleet` command: one entry point, each subcommand owned by the subpackage it runs.

Subcommands are imported lazily so that, e.g., the router image never imports kopf.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import sys

import httpx
import yaml

from pdfleet.cli.argtypes import fail

# subcommand -> (module with `main(argv) -> int`, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "operator": ("pdfleet.operator.main", "run the Kopf operator"),
    "render": ("pdfleet.reconcile.cli", "print the objects the operator would create for a PDDeployment file"),
    "router": ("pdfleet.router.cli", "run the rack-aware PD router"),
    "engine": ("pdfleet.engine.cli", "run the vLLM-compatible engine emulator (accepts `vllm serve` args)"),
    "gen-crd": ("pdfleet.api.cli", "write the CRD generated from the pydantic model to crds/"),
    "autoscaler": ("pdfleet.autoscale.cli", "print the autoscaler's PromQL, or read a fleet's signals from Prometheus"),
    "demo": ("pdfleet.localfleet.demo", "run the local demo fleet (control plane, operator, Prometheus, load)"),
    "replay": ("pdfleet.loadgen.replay", "replay a request trace or synthetic profile against a router"),
    "simulate": ("pdfleet.sim.cli", "trace-driven fleet simulator comparing scaling policies"),
}


# Errors a command meets in the world (missing files, closed ports, bad input): one line, not a traceback.
USER_ERRORS = (OSError, ValueError, yaml.YAMLError, httpx.HTTPError)
DEBUG_ENV = "PDFLEET_DEBUG"  # set to print the traceback of such an error too


def version() -> str:
    """The installed package's version (its metadata), e.g. `0.1.0`."""
    return importlib.metadata.version("pdfleet")


def usage() -> str:
    lines = ["usage: pdfleet [--version] <command> [args]  (pdfleet <command> --help)", "", "commands:"]
    lines += [f"  {name:<18}{help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"pdfleet {version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        return fail("pdfleet", f"unknown command {name!r} (pdfleet --help lists them)", 2)
    module = importlib.import_module(SUBCOMMANDS[name][0])
    try:
        return int(module.main(rest) or 0)
    except KeyboardInterrupt:
        return 130
    except USER_ERRORS as error:
        if os.environ.get(DEBUG_ENV):
            logging.getLogger("pdfleet").exception("pdfleet %s failed", name)
        return fail(f"pdfleet {name}", f"{_one_line(error)} (set {DEBUG_ENV}=1 for the traceback)")


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if isinstance(error, (OSError, ValueError)) else f"{type(error).__name__}: {text}"
