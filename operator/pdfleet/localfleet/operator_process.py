"""Run the pdfleet operator as a local process against a kubeconfig -- test and demo infrastructure.

Also installs the CRD from `crds/` (the generated file, the same one the chart and manifests ship).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from pdfleet.localfleet.controlplane import die_with_parent_hook, wait_until
from pdfleet.localfleet.processes import free_ports, stop_process

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


class OperatorProcess:
    """`pdfleet operator` in a subprocess, logging to a file; `metrics()` scrapes its Prometheus endpoint."""

    def __init__(self, kubeconfig: Path, extra_env: dict[str, str] | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.extra_env = extra_env or {}
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

    def __enter__(self) -> OperatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
