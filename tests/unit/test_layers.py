"""The package layout is the architecture: each subpackage imports only the ones below it (docs/architecture.md).

Every `import pdfleet.X` / `from pdfleet.X import ...` in operator/pdfleet, at any depth of the module (lazy imports
inside functions count too), must be an edge this table allows. So a controller cannot reach into its sibling, a pure
layer cannot call an adapter, and nothing that ships imports the test-only `pdfleet.testing`.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pdfleet
from pdfleet.cli.main import SUBCOMMANDS

PACKAGE = Path(pdfleet.__file__).parent

# subpackage -> the subpackages it may import (the root module's constants are open to all; every command's parser
# takes its types from `cli.argtypes`, so the packages with a command may import `cli`)
ALLOWED: dict[str, set[str]] = {
    # pure foundations
    "api": {"cli"},
    "perfmodel": set(),
    "topology": {"api"},
    "render": {"api", "topology"},
    # one adapter to the cluster, shared by both controllers
    "cluster": {"api", "topology", "render"},
    # the two controllers: siblings that never import each other
    "reconcile": {"api", "topology", "render", "cluster", "cli"},
    "autoscale": {"api", "topology", "perfmodel", "cluster", "cli"},
    # the operator process wires the controllers and its fleet metrics
    "operator": {"api", "cluster", "reconcile", "autoscale", "cli"},
    # data plane and engines: no operator code
    "router": {"cli"},
    "engine": {"perfmodel", "cli"},
    # the simulator runs the router's and the autoscaler's own policy code
    "sim": {"api", "topology", "perfmodel", "autoscale", "router", "cli"},
    "loadgen": {"sim", "cli"},
    "localfleet": {"api", "render", "sim", "loadgen", "cli"},
    # build-time generators derive the chart from the code
    "chart": {"api", "cluster", "reconcile", "autoscale", "operator", "router", "localfleet"},
    # test-only helpers; nothing above imports them
    "testing": {"api", "topology", "render", "sim", "loadgen", "localfleet", "engine", "router"},
    # the command dispatcher names subcommands by module path (strings), importing none directly; its argument types
    # (`cli.argtypes`) import nothing of pdfleet, so every command may use them
    "cli": set(),
}


def _imports(path: Path) -> Iterator[tuple[str, int]]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module, node.lineno
        elif isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield "." * node.level + (node.module or ""), node.lineno  # relative: only within its subpackage


def _edges() -> list[tuple[str, str, str]]:
    """(importing subpackage, imported subpackage, where) for every cross-package import."""
    edges = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if len(parts) == 1:
            continue  # __init__ (constants) and __main__ (the entry point)
        for module, line in _imports(path):
            if module.startswith(".."):
                target = "a relative import out of its subpackage"
            elif module.startswith("pdfleet."):
                target = module.split(".")[1]
            else:
                continue
            if target != parts[0]:
                edges.append((parts[0], target, f"{path.relative_to(PACKAGE)}:{line}"))
    return edges


def test_every_subpackage_is_in_the_layer_table() -> None:
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert packages == set(ALLOWED)


def test_imports_point_down_only() -> None:
    upward = [f"{where}: {src} imports {dst}" for src, dst, where in _edges() if dst not in ALLOWED[src]]
    assert not upward, "imports the layer table does not allow:\n" + "\n".join(upward)


def test_the_layer_table_has_no_cycle() -> None:
    done: set[str] = set()

    def visit(package: str, path: tuple[str, ...]) -> None:
        assert package not in path, f"cycle: {' -> '.join((*path, package))}"
        if package not in done:
            for below in ALLOWED[package]:
                visit(below, (*path, package))
            done.add(package)

    for package in ALLOWED:
        visit(package, ())


def test_nothing_that_ships_imports_testing() -> None:
    assert all("testing" not in allowed for package, allowed in ALLOWED.items() if package != "testing")


def test_every_subcommand_module_imports() -> None:
    for module, _ in SUBCOMMANDS.values():
        assert callable(importlib.import_module(module).main)
