"""The operator's RBAC rules, derived from the code that makes the API calls (least privilege, no guessing).

Why derive instead of declare: the reconcile code is the only truth of what the operator calls, and a hand-kept list
drifts silently. So the rules are computed from three places and written to charts/pdfleet/files/rbac-rules.yaml by
`scripts/render_manifests.py` (a drift test fails when the chart is stale):

1. Kopf's registry after importing the handler modules `pdfleet operator` imports: every resource with an index or
   event handler is listed and watched; every resource with change handlers or daemons is also patched (Kopf writes
   its finalizer and progress annotations onto the object).
2. `KubeClient` (pdfleet.cluster.kube): each method's HTTP verb is read from its `_call("VERB", ...)` by AST (a GET of
   a path ending in a name is `get`, of a collection `list`), and
   only methods the operator package calls on a `kube` object count (following calls between KubeClient methods, with
   their constant `subresource=` argument); a server-side apply PATCH also needs `create` (the apiserver authorizes an
   apply that creates the object as a create). Paths built with `collection_path` address CHILD_KINDS; `/apis/...`
   paths address the PDDeployment (or its subresource); `SECRETS` paths the routers' admin token Secrets; `/apis` alone
   is discovery.
3. Kopf's own needs, declared here: posting Events, observing CRDs, and (only with peering) the peering objects.

The rules are then split by scope. Cluster-scoped resources (Nodes, CRDs) can only be granted by a ClusterRole;
everything else lives in namespaces, so with `watchNamespaces` the chart grants it by a Role in each watched namespace
and the ClusterRole only reads (plus the Namespaces Kopf follows in that mode). Cluster-wide, a ClusterRole holds all.

The integration tests then run the real operator with the chart's ServiceAccount token, cluster-wide and namespaced,
proving the rules suffice.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import yaml

from pdfleet import API_GROUP, PLURAL

HTTP_VERBS = {"GET": "list", "PATCH": "patch", "DELETE": "delete", "POST": "create", "PUT": "update"}
ITEM_GET_VERB = "get"  # a GET of one named object (HTTP_VERBS' "list" is a GET of a collection)
CORE_GROUP = ""
Rule = tuple[str, str, str]  # (apiGroup, resource, verb)

# Kopf's framework needs (not visible in handler registrations)
KOPF_RULES: tuple[Rule, ...] = (
    (CORE_GROUP, "events", "create"),  # kopf.event() and Kopf's handler-failure events
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),  # resource observation: notices CRDs added later
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
)
# Kopf's namespace observation: with --namespace it lists and watches Namespaces to follow the watched ones
# (cluster-wide it does not). Without these it retries the forbidden list for about a minute before it falls back to
# the given names, and handles nothing meanwhile.
KOPF_NAMESPACED_MODE_RULES: tuple[Rule, ...] = ((CORE_GROUP, "namespaces", "list"), (CORE_GROUP, "namespaces", "watch"))
PEERING_VERBS = ("list", "watch", "patch")  # Kopf watches the peering object and patches its own keep-alive into it
PEERING_GROUP = "kopf.dev"
# Resources that exist outside namespaces (a Role cannot grant them). Every other resource a rule names must be known
# to be namespaced (NAMESPACED_RESOURCES or a namespaced child kind); an unknown one fails the generation.
CLUSTER_SCOPED_RESOURCES = {
    (CORE_GROUP, "nodes"),
    (CORE_GROUP, "namespaces"),
    ("apiextensions.k8s.io", "customresourcedefinitions"),
    (PEERING_GROUP, "clusterkopfpeerings"),
}
NAMESPACED_RESOURCES = {
    (CORE_GROUP, "pods"),
    (CORE_GROUP, "events"),
    (CORE_GROUP, "secrets"),
    (API_GROUP, PLURAL),
    (PEERING_GROUP, "kopfpeerings"),
}


def operator_handler_modules() -> list[str]:
    """The pdfleet modules `pdfleet operator` imports to register its Kopf handlers (read from its CLI module)."""
    from pdfleet.operator import main as cli

    tree = ast.parse(inspect.getsource(cli))
    return sorted(
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.startswith("pdfleet.")
    )


def kopf_rules() -> set[Rule]:
    """list/watch for every resource a Kopf handler follows; patch where Kopf stores finalizers and progress."""
    import kopf

    for module in operator_handler_modules():
        importlib.import_module(module)  # registers its handlers with Kopf's default registry
    registry = kopf.get_default_registry()
    rules: set[Rule] = set()
    # Kopf has no public way to enumerate registrations; these registries are what its own orchestrator reads
    following = [*registry._indexing.get_all_handlers(), *registry._watching.get_all_handlers()]
    persisting = [*registry._changing.get_all_handlers(), *registry._spawning.get_all_handlers()]
    for handler, verbs in [(h, ("list", "watch")) for h in following] + [
        (h, ("list", "watch", "patch")) for h in persisting
    ]:
        selector = handler.selector
        # the operator names group-less selectors only for core kinds (nodes, pods); Kopf resolves them by discovery
        group = selector.group or CORE_GROUP
        rules.update((group, selector.plural or selector.any_name, verb) for verb in verbs)
    return rules


def http_calls(method: ast.FunctionDef) -> list[tuple[str, str]]:
    """(verb, target) of each `self._call("VERB", path, ...)` in a KubeClient method.

    target: `children` (a CHILD_KINDS path), `secrets` (a SECRETS path), `custom` (a custom-object path, plus
    `/<subresource>` when the path appends the method's `subresource` argument), `custom/status`-style literals, or
    `discovery` (`/apis`).
    """
    assigned = {
        target.id: node.value
        for node in ast.walk(method)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    found = []
    for node in ast.walk(method):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_call"):
            continue
        verb, path = node.args[0], node.args[1]
        if isinstance(path, ast.Name) and path.id in assigned:  # `path = f"..."; self._call("PATCH", path)`
            path = assigned[path.id]
        path_text = ast.unparse(path)
        if isinstance(path, ast.Constant) and path.value == "/apis":
            target = "discovery"
        elif "SECRETS.collection_path" in path_text:
            target = "secrets"
        elif "collection_path" in path_text:
            target = "children"
        elif "subresource" in path_text:
            target = "custom/{subresource}"
        else:
            target = "custom/status" if path_text.rstrip("'\"").endswith("/status") else "custom"
        names_one = isinstance(path, ast.JoinedStr) and isinstance(path.values[-1], ast.FormattedValue)
        found.append((ITEM_GET_VERB if verb.value == "GET" and names_one else HTTP_VERBS[verb.value], target))
        if any(k.arg == "content_type" and "apply-patch" in ast.unparse(k.value) for k in node.keywords):
            found.append(("create", target))  # server-side apply creates missing objects: authorized as create
    return found


def _subresource(call: ast.Call) -> str:
    """The constant `subresource=` keyword of a call, or "" (the main resource)."""
    for keyword in call.keywords:
        if keyword.arg == "subresource" and isinstance(keyword.value, ast.Constant):
            return keyword.value.value
    return ""


def _method_calls(tree: ast.AST, owner: str) -> list[tuple[str, str]]:
    """(method, subresource) of every call `<owner>.method(...)` or `<x>.<owner>.method(...)` in `tree`."""
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            value = node.func.value
            name = value.attr if isinstance(value, ast.Attribute) else getattr(value, "id", "")
            if name == owner:
                calls.append((node.func.attr, _subresource(node)))
    return calls


def kube_client_rules() -> set[Rule]:
    """Verbs the KubeClient methods the operator calls (directly or via other methods) send, on what they address."""
    from pdfleet.cluster import kube

    tree = ast.parse(inspect.getsource(kube.KubeClient))
    methods = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    package_dir = Path(inspect.getfile(kube)).parents[1]
    children = {(rt.api_version.rpartition("/")[0], rt.plural) for rt in kube.CHILD_KINDS.values()}
    # custom-object methods take group/plural arguments; the only custom kind the operator writes is its own
    calls = [c for source in package_dir.rglob("*.py") for c in _method_calls(ast.parse(source.read_text()), "kube")]
    rules: set[Rule] = set()
    seen: set[tuple[str, str]] = set()
    while calls:
        name, subresource = calls.pop()
        if name not in methods or (name, subresource) in seen:
            continue
        seen.add((name, subresource))
        calls += _method_calls(methods[name], "self")  # e.g. patch_status delegating to patch_custom
        for verb, target in http_calls(methods[name]):
            if target == "children":
                rules.update((group, resource, verb) for group, resource in children)
            elif target == "secrets":
                rules.add((CORE_GROUP, "secrets", verb))
            elif target != "discovery":
                resource = target.replace("custom", PLURAL).replace("{subresource}", subresource).rstrip("/")
                rules.add((API_GROUP, resource, verb))
    return rules


def as_cluster_role_rules(rules: Iterable[Rule]) -> list[dict]:
    """Kubernetes PolicyRules: one per (apiGroup, resource), verbs sorted, in a stable order."""
    verbs: dict[tuple[str, str], set[str]] = defaultdict(set)
    for group, resource, verb in rules:
        verbs[(group, resource)].add(verb)
    return [
        {"apiGroups": [group], "resources": [resource], "verbs": sorted(v)}
        for (group, resource), v in sorted(verbs.items())
    ]


def is_cluster_scoped(group: str, resource: str) -> bool:
    """Whether `resource` (or the resource of a subresource like `pddeployments/status`) is cluster-scoped."""
    from pdfleet.cluster import kube

    base = (group, resource.partition("/")[0])
    if base in CLUSTER_SCOPED_RESOURCES:
        return True
    children = {(rt.api_version.rpartition("/")[0], rt.plural): rt.namespaced for rt in kube.CHILD_KINDS.values()}
    if base in NAMESPACED_RESOURCES or children.get(base):
        return False
    raise ValueError(f"scope of {base} unknown: add it to CLUSTER_SCOPED_RESOURCES or NAMESPACED_RESOURCES")


def _derived_rules() -> set[Rule]:
    return kopf_rules() | kube_client_rules() | set(KOPF_RULES)


def cluster_scoped_rules() -> list[dict]:
    """Rules on cluster-scoped resources (Nodes, CRDs): a ClusterRole in both modes."""
    return as_cluster_role_rules(r for r in _derived_rules() if is_cluster_scoped(r[0], r[1]))


def namespaced_rules() -> list[dict]:
    """Rules on namespaced resources: a Role per watched namespace, or part of the ClusterRole when cluster-wide."""
    return as_cluster_role_rules(r for r in _derived_rules() if not is_cluster_scoped(r[0], r[1]))


def namespace_observation_rules() -> list[dict]:
    """Cluster-scoped reads only a namespaced operator needs (Kopf follows its watched namespaces)."""
    return as_cluster_role_rules(KOPF_NAMESPACED_MODE_RULES)


def peering_rules(*, clusterwide: bool) -> list[dict]:
    """Kopf peering: a cluster-wide operator uses ClusterKopfPeering, a namespaced one KopfPeering per namespace."""
    resource = "clusterkopfpeerings" if clusterwide else "kopfpeerings"
    return as_cluster_role_rules((PEERING_GROUP, resource, verb) for verb in PEERING_VERBS)


def cluster_role_rules(*, namespaced: bool, peering: bool) -> list[dict]:
    """What the chart's ClusterRole holds: cluster-wide, every rule; namespaced (`watchNamespaces`), reads only."""
    if namespaced:
        return cluster_scoped_rules() + namespace_observation_rules()
    return cluster_scoped_rules() + namespaced_rules() + (peering_rules(clusterwide=True) if peering else [])


def role_rules(*, peering: bool) -> list[dict]:
    """What the chart's Role in each watched namespace holds (namespaced mode only)."""
    return namespaced_rules() + (peering_rules(clusterwide=False) if peering else [])


def operator_rules() -> list[dict]:
    """The cluster-wide operator's ClusterRole rules without peering (every rule the code derives)."""
    return cluster_role_rules(namespaced=False, peering=False)


def rules_file() -> str:
    """YAML of the rule sets by scope (what charts/pdfleet/files/rbac-rules.yaml must hold); templates/rbac.yaml
    puts them together as cluster_role_rules() and role_rules() do."""
    header = (
        "# Generated by scripts/render_manifests.py from pdfleet.chart.rbac. Do not edit by hand.\n"
        "# clusterScoped: ClusterRole always. namespaced: a Role per watched namespace, or the ClusterRole when\n"
        "# cluster-wide. namespaceObservation: ClusterRole, with watchNamespaces only. peering: with Kopf peering,\n"
        "# clusterScoped in the ClusterRole (cluster-wide) or namespaced in each Role (watchNamespaces).\n"
    )
    rule_sets = {
        "clusterScoped": cluster_scoped_rules(),
        "namespaced": namespaced_rules(),
        "namespaceObservation": namespace_observation_rules(),
        "peering": {
            "clusterScoped": peering_rules(clusterwide=True),
            "namespaced": peering_rules(clusterwide=False),
        },
    }
    return header + yaml.safe_dump(rule_sets, sort_keys=False)
