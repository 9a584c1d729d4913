"""`pdfleet render -f pdd.yaml [--nodes nodes.yaml]`: print the objects the operator would create for a PDDeployment,
like `helm template`, or the error the operator would report (InvalidSpec, unknown fields, no matching nodes).

The spec goes through the operator's own `plan_reconcile` (nothing running, no pods yet), so what is printed is what a
first reconcile applies: pool and cell Services, PDBs, cell StatefulSets, the router Deployment, Service, PDB and its
fleet-view ConfigMap. Without --nodes the cluster is one rack ("rack-a", zone "zone-a") holding, per pool, one Ready
node with the pool's GPU product and node selector labels and GPUs for its replicas (its autoscaling maximum when
autoscaling is on).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from pdfleet import API_GROUP, API_VERSION, KIND, OPERATOR_IMAGE, POOLS
from pdfleet.api.model import GPU_RESOURCE, PDDeploymentSpec, SpecError, parse_spec
from pdfleet.cli.argtypes import CommandParser, existing_file, fail
from pdfleet.reconcile.plan import plan_reconcile

PROG = "pdfleet render"
DEFAULT_RACK, DEFAULT_ZONE = "rack-a", "zone-a"
RENDERED_AT = "1970-01-01T00:00:00Z"  # conditions' lastTransitionTime; never printed


def _parser() -> CommandParser:
    p = CommandParser(prog=PROG, description=__doc__)
    p.add_argument("-f", "--filename", type=existing_file, required=True, help="PDDeployment YAML (one or more)")
    p.add_argument(
        "--nodes",
        type=existing_file,
        help="Node objects to place on (YAML: documents, a list, or a kubectl List); default: one rack that fits",
    )
    p.add_argument("--namespace", "-n", default="default", help="namespace of a PDDeployment that names none")
    p.add_argument("--operator-image", default=OPERATOR_IMAGE, help="image of the router (unless spec.router.image)")
    p.add_argument(
        "--pdb-api-version",
        default="policy/v1",
        choices=("policy/v1", "policy/v1beta1"),
        help="PodDisruptionBudget API the cluster serves (policy/v1beta1 before Kubernetes 1.21)",
    )
    return p


def load_documents(path: Path) -> list[dict[str, Any]]:
    """The objects of a YAML file: its documents, list items, and `List` items, flattened (empty documents dropped)."""
    objects: list[dict[str, Any]] = []
    for document in yaml.safe_load_all(path.read_text()):
        items = document if isinstance(document, list) else [document]
        for item in items:
            if isinstance(item, dict) and str(item.get("kind", "")).endswith("List") and "items" in item:
                objects += item["items"] or []
            elif item is not None:
                objects.append(item)
    for obj in objects:
        if not isinstance(obj, dict):
            raise ValueError(f"{path}: expected Kubernetes objects, found {type(obj).__name__} {obj!r}")
    return objects


def default_nodes(spec: PDDeploymentSpec) -> list[dict[str, Any]]:
    """One rack with, per pool, one Ready node that fits it (its GPU product, node selector, GPUs for its replicas)."""
    nodes = []
    for pool_name in POOLS:
        pool = spec.pool(pool_name)
        replicas = max(pool.replicas, pool.autoscaling.max_replicas if pool.autoscaling.enabled else 0, 1)
        labels = {spec.topology.rack_label: DEFAULT_RACK, spec.topology.zone_label: DEFAULT_ZONE, **pool.node_selector}
        if pool.gpu_product:
            labels[spec.topology.gpu_product_label] = pool.gpu_product
        nodes.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": f"{DEFAULT_RACK}-{pool_name}", "labels": labels},
                "status": {
                    "allocatable": {GPU_RESOURCE: str(replicas * max(pool.gpus_per_replica, 1))},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        )
    return nodes


def render_pddeployment(
    pdd: dict[str, Any], nodes: list[dict[str, Any]] | None, *, operator_image: str, pdb_api_version: str
) -> tuple[list[dict[str, Any]], list[str]]:
    """(objects a first reconcile of `pdd` applies, warnings); raises SpecError with the operator's own message when
    the operator would reject the spec or cannot place it. `nodes` None: `default_nodes` of the spec."""
    if nodes is None:
        try:
            nodes = default_nodes(parse_spec(pdd.get("spec") or {}))
        except SpecError:
            nodes = []  # plan_reconcile reports the spec error itself
    metadata = pdd.get("metadata") or {}
    body = {**pdd, "metadata": {**metadata, "uid": metadata.get("uid", "rendered"), "generation": 1}}
    plan = plan_reconcile(
        pdd=body,
        nodes=nodes,
        children=[],
        pods=[],
        pdb_api_version=pdb_api_version,
        operator_image=operator_image,
        now=RENDERED_AT,
    )
    conditions = {c["type"]: c for c in plan.status["conditions"]}
    for kind in ("InvalidSpec", "UnknownFields"):
        if conditions.get(kind, {}).get("status") == "True":
            raise SpecError(f"{kind}: {conditions[kind]['message']}")
    degraded = conditions.get("Degraded", {})
    if not plan.applies and degraded.get("status") == "True":
        raise SpecError(f"{degraded['reason']}: {degraded['message']}")
    warnings = [f"{degraded['reason']}: {degraded['message']}"] if degraded.get("status") == "True" else []
    return list(plan.applies), warnings


def main(argv: list[str]) -> int:
    """Entry point of `pdfleet render`."""
    args = _parser().parse_args(argv)
    nodes = [n for n in load_documents(args.nodes) if n.get("kind") == "Node"] if args.nodes else None
    if nodes is None:
        print(
            f"{PROG}: no --nodes: placing on one rack {DEFAULT_RACK!r} with a node per pool that fits it",
            file=sys.stderr,
        )
    rendered: list[dict[str, Any]] = []
    for pdd in load_documents(args.filename):
        name = (pdd.get("metadata") or {}).get("name")
        if (pdd.get("apiVersion"), pdd.get("kind")) != (f"{API_GROUP}/{API_VERSION}", KIND):
            return fail(
                PROG, f"{args.filename}: {pdd.get('kind')!r} {name!r} is not a {API_GROUP}/{API_VERSION} {KIND}"
            )
        if not name:
            return fail(PROG, f"{args.filename}: a {KIND} without metadata.name")
        pdd = {**pdd, "metadata": {"namespace": args.namespace, **pdd["metadata"]}}
        try:
            objects, warnings = render_pddeployment(
                pdd, nodes, operator_image=args.operator_image, pdb_api_version=args.pdb_api_version
            )
        except SpecError as error:
            return fail(PROG, f"{args.filename}: {KIND} {name!r}: {error}")
        for warning in warnings:
            print(f"{PROG}: warning: {KIND} {name!r}: {warning}", file=sys.stderr)
        rendered += objects
    if not rendered:
        return fail(PROG, f"{args.filename}: no {KIND} in it")
    sys.stdout.write(yaml.safe_dump_all(rendered, sort_keys=False, width=120))
    return 0
