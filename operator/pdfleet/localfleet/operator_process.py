"""Run the pdfleet operator as a local process against a kubeconfig -- test and demo infrastructure.

Also installs the CRD from `crds/` (the generated file, the same one the chart and manifests ship).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from pdfleet.localfleet.controlplane import die_with_parent_hook, wait_until
from pdfleet.localfleet.processes import free_ports, signal_process, stop_process

REPO_ROOT = Path(__file__).resolve().parents[3]
CRD_PATH = REPO_ROOT / "crds" / "pdfleet.dev_pddeployments.yaml"


def install_crd(api_client: Any, timeout: float = 30.0) -> None:
    """Create or replace the PDDeployment CRD and wait until it is Established."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    crd = yaml.safe_load(CRD_PATH.read_text())
    ext = client.ApiextensionsV1Api(api_client)
    name = crd["metadata"]["name"]
    try:
        ext.create_custom_resource_definition(crd)
    except ApiException as error:
        if error.status != 409:
            raise
        crd["metadata"]["resourceVersion"] = ext.read_custom_resource_definition(name).metadata.resource_version
        ext.replace_custom_resource_definition(name, crd)

    def established() -> bool:
        conditions = ext.read_custom_resource_definition(name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait_until(established, timeout, f"CRD {name} Established")


def kopf_peering_crd(kind: str) -> dict[str, Any]:
    """Kopf's peering CRD `kind` (ClusterKopfPeering or KopfPeering) as the chart installs it (its crds/)."""
    plural = f"{kind.lower()}s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.kopf.dev"},
        "spec": {
            "group": "kopf.dev",
            "scope": "Cluster" if kind == "ClusterKopfPeering" else "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                        }
                    },
                }
            ],
        },
    }


def install_kopf_peering(api_client: Any, name: str, namespace: str | None = None, timeout: float = 30.0) -> list[str]:
    """Install Kopf's peering CRDs (unless present) and the peering object `name` (a KopfPeering in `namespace`, else
    a ClusterKopfPeering). Returns the names of the CRDs this call created (for the caller to remove)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    ext = client.ApiextensionsV1Api(api_client)
    created = []
    for kind in ("ClusterKopfPeering", "KopfPeering"):
        crd = kopf_peering_crd(kind)
        try:
            ext.create_custom_resource_definition(crd)
            created.append(crd["metadata"]["name"])
        except ApiException as error:
            if error.status != 409:
                raise

    def established(crd_name: str) -> bool:
        conditions = ext.read_custom_resource_definition(crd_name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    for kind in ("ClusterKopfPeering", "KopfPeering"):
        crd_name = kopf_peering_crd(kind)["metadata"]["name"]
        wait_until(lambda: established(crd_name), timeout, f"CRD {crd_name} Established")
    custom = client.CustomObjectsApi(api_client)
    kind = "KopfPeering" if namespace else "ClusterKopfPeering"
    body = {"apiVersion": "kopf.dev/v1", "kind": kind, "metadata": {"name": name}}
    try:
        if namespace:
            custom.create_namespaced_custom_object("kopf.dev", "v1", namespace, "kopfpeerings", body)
        else:
            custom.create_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", body)
    except ApiException as error:
        if error.status != 409:
            raise
    return created


def remove_crds(api_client: Any, names: Sequence[str], timeout: float = 60.0) -> None:
    """Delete the CRDs `names` and wait until they are gone."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    ext = client.ApiextensionsV1Api(api_client)
    for name in names:
        try:
            ext.delete_custom_resource_definition(name)
        except ApiException as error:
            if error.status != 404:
                raise

    def gone() -> bool:
        present = {crd.metadata.name for crd in ext.list_custom_resource_definition().items}
        return not present.intersection(names)

    wait_until(gone, timeout, f"CRDs {', '.join(names)} removed")


class OperatorProcess:
    """`pdfleet operator` in a subprocess, logging to a file; `metrics()` scrapes its Prometheus endpoint.

    `args` are extra `pdfleet operator` arguments (e.g. `--peering`, `--namespace`)."""

    def __init__(self, kubeconfig: Path, extra_env: dict[str, str] | None = None, args: Sequence[str] = ()) -> None:
        self.kubeconfig = kubeconfig
        self.extra_env = extra_env or {}
        self.args = list(args)
        self.metrics_port, self.health_port = free_ports(2)
        self.log_path = Path(tempfile.mkstemp(prefix="pdfleet-operator-", suffix=".log")[1])
        self.popen: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> OperatorProcess:
        """Start the operator subprocess and wait until its metrics port answers."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1", **self.extra_env}
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pdfleet",
                    "operator",
                    "--metrics-port",
                    str(self.metrics_port),
                    "--health-address",
                    f"127.0.0.1:{self.health_port}",
                    *self.args,
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent_hook(),
            )
        wait_until(self._healthy, timeout, f"operator liveness (log: {self.log_path})")
        return self

    def _healthy(self) -> bool:
        if self.popen is not None and self.popen.poll() is not None:
            raise RuntimeError(f"operator exited with {self.popen.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    def metrics(self) -> dict[str, float]:
        """Current values of the operator's metrics, keyed by `name{labels}` exactly as exposed."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                values[key] = float(value)
        return values

    def metric_sum(self, prefix: str) -> float:
        """Sum of every exposed sample whose series starts with `prefix`."""
        return sum(v for k, v in self.metrics().items() if k.startswith(prefix))

    def log_tail(self, lines: int = 60) -> str:
        """The last `lines` lines of the operator's log."""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the operator (SIGTERM, then SIGKILL after a grace period)."""
        if self.popen is None:
            return
        stop_process(self.popen, grace_s=15, reap_s=5)
        self.popen = None

    def kill(self) -> None:
        """SIGKILL the operator (a crash or a lost node: no goodbye to its peers) and reap it."""
        if self.popen is None:
            return
        signal_process(self.popen, signal.SIGKILL, group=True)
        self.popen.wait(timeout=10)
        self.popen = None

    def __enter__(self) -> OperatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
