"""`pdfleet` command: one entry point, each subcommand owned by the subpackage it runs.

Subcommands are imported lazily so that, e.g., the router image never imports kopf.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module with `main(argv) -> int`, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "operator": ("pdfleet.operator.main", "run the Kopf operator"),
    "router": ("pdfleet.router.cli", "run the rack-aware PD router"),
    "engine": ("pdfleet.engine.cli", "run the vLLM-compatible engine emulator (accepts `vllm serve` args)"),
    "gen-crd": ("pdfleet.api.cli", "write the CRD generated from the pydantic model to crds/"),
    "autoscaler": ("pdfleet.autoscale.cli", "print the autoscaler's PromQL, or read a fleet's signals from Prometheus"),
    "demo": ("pdfleet.localfleet.demo", "run the local demo fleet (control plane, operator, Prometheus, load)"),
    "replay": ("pdfleet.loadgen.replay", "replay a request trace or synthetic profile against a router"),
    "simulate": ("pdfleet.sim.cli", "trace-driven fleet simulator comparing scaling policies"),
}


def usage() -> str:
    lines = ["usage: pdfleet <command> [args]", "", "commands:"]
    lines += [f"  {name:<18}{help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"pdfleet: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)
