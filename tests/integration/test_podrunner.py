"""The local pod runner on the real control plane: it runs pods as processes on 127.b.x.y, reports them, restarts
crashed ones, refreshes configMap volumes, and finishes deleted pods. Pods are bound to a tainted node of their own
(spec.nodeName), so other tests' pods never land on it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client

from pdfleet.localfleet.controlplane import LocalControlPlane, wait_until
from pdfleet.localfleet.podrunner import LocalPodRunner

NODE = "podrunner-node"
ENGINE_PORT = 8000


@pytest.fixture(scope="module")
def runner(control_plane: LocalControlPlane) -> Iterator[LocalPodRunner]:
    control_plane.register_node(
        NODE,
        {"nvidia.com/gpu.product": "NVIDIA-L4"},
        gpus=4,
        taints=[{"key": "pdfleet.dev/podrunner-test", "effect": "NoSchedule"}],
    )
    api = control_plane.api_client()
    with LocalPodRunner(api, node_names=[NODE]) as pod_runner:
        yield pod_runner
    api.close()
    control_plane.delete_node(NODE)


@pytest.fixture
def core(control_plane: LocalControlPlane) -> Iterator[client.CoreV1Api]:
    api = control_plane.api_client()
    yield client.CoreV1Api(api)
    api.close()


def engine_pod(name: str) -> dict[str, Any]:
    """A pod shaped like a rendered engine StatefulSet pod (vllm serve, named port, downward-API env, probe)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "engine",
                    "image": "vllm/vllm-openai:v0.32.0",
                    "command": ["vllm", "serve"],
                    "args": [
                        "Qwen/Qwen2.5-0.5B-Instruct",
                        "--port",
                        str(ENGINE_PORT),
                        "--served-model-name",
                        "qwen",
                        "--kv-transfer-config",
                        '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}',
                    ],
                    "ports": [{"name": "http", "containerPort": ENGINE_PORT}],
                    "env": [
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "PDFLEET_RACK", "value": "rack-z"},
                    ],
                    "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
                    "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
                }
            ],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        },
    }


def read(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    return core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, namespace))


def ready(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, Any] | None:
    pod = read(core, namespace, name)
    conditions = pod["status"].get("conditions") or []
    return pod if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else None


def gone(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
    except client.ApiException as error:
        return error.status == 404
    return False


def test_engine_pod_runs_the_emulator_reports_ready_restarts_and_goes_away(
    runner: LocalPodRunner, core: client.CoreV1Api, namespace: str
):
    core.create_namespaced_pod(namespace, engine_pod("engine-0"))
    pod = wait_until(lambda: ready(core, namespace, "engine-0"), 30, "engine pod Ready")
    ip = pod["status"]["podIP"]
    assert ip.startswith(f"127.{1 + runner.address_block}.") and pod["status"]["phase"] == "Running"
    state = httpx.get(f"http://{ip}:{ENGINE_PORT}/internal/state", trust_env=False, timeout=5).json()
    assert state["role"] == "prefill" and state["rack"] == "rack-z"
    reply = httpx.post(
        f"http://{ip}:{ENGINE_PORT}/v1/completions",
        trust_env=False,
        timeout=10,
        json={
            "model": "qwen",
            "prompt": [1] * 100,
            "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
        },
    )
    assert reply.json()["kv_transfer_params"]["remote_host"] == ip  # POD_IP from the downward API
    process = runner.find(namespace, "engine-0").process
    assert process.args[process.args.index("--host") + 1] == ip
    assert process.poll() is None and "PDFLEET_EMULATOR_GPU" in runner.find(namespace, "engine-0").env

    assert runner.kill_pod_process(namespace, "engine-0")
    restarted = wait_until(
        lambda: (
            (p := ready(core, namespace, "engine-0")) and p["status"]["containerStatuses"][0]["restartCount"] == 1 and p
        ),
        30,
        "restart",
    )
    assert restarted["status"]["podIP"] == ip
    assert restarted["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == -9

    new_process = runner.find(namespace, "engine-0").process
    core.delete_namespaced_pod("engine-0", namespace)  # graceful: SIGTERM, then the runner removes the object
    wait_until(lambda: gone(core, namespace, "engine-0"), 20, "pod object removed")
    assert new_process.poll() is not None and runner.find(namespace, "engine-0") is None


def test_router_pod_reads_its_configmap_volume_and_sees_updates(
    runner: LocalPodRunner, core: client.CoreV1Api, namespace: str
):
    def fleet(generation: int) -> dict[str, str]:
        return {
            "fleet.json": json.dumps(
                {"version": 1, "generation": generation, "model": "qwen", "policy": {}, "endpoints": []}
            )
        }

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "router-0"},
        "spec": {
            "nodeName": NODE,
            "containers": [
                {
                    "name": "router",
                    "image": "pdfleet",
                    "command": [
                        "pdfleet",
                        "router",
                        "--fleet-file",
                        "/etc/pdfleet/fleet.json",
                        "--port",
                        "8080",
                        "--admin-port",
                        "8081",
                        "--admin-token-file",
                        "/var/run/admin/token",
                    ],
                    "ports": [{"name": "http", "containerPort": 8080}, {"name": "admin", "containerPort": 8081}],
                    "readinessProbe": {"httpGet": {"path": "/health", "port": "admin"}, "periodSeconds": 1},
                    "volumeMounts": [
                        {"name": "fleet", "mountPath": "/etc/pdfleet", "readOnly": True},
                        {"name": "admin", "mountPath": "/var/run/admin", "readOnly": True},
                    ],
                }
            ],
            "volumes": [
                {"name": "fleet", "configMap": {"name": "router-fleet"}},
                {"name": "admin", "secret": {"secretName": "router-admin"}},
            ],
        },
    }
    core.create_namespaced_pod(namespace, pod)
    # The kubelet does not start a pod whose configMap volume does not exist yet.
    wait_until(lambda: runner.find(namespace, "router-0"), 10, "router pod admitted")
    assert runner.find(namespace, "router-0").process is None
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "router-fleet"}, "data": fleet(1)})
    assert runner.find(namespace, "router-0").process is None  # nor one whose secret volume does not
    core.create_namespaced_secret(namespace, {"metadata": {"name": "router-admin"}, "stringData": {"token": "t0ken"}})
    ip = wait_until(lambda: ready(core, namespace, "router-0"), 30, "router Ready")["status"]["podIP"]

    def generation() -> int:
        auth = {"Authorization": "Bearer t0ken"}  # the token from the secret volume
        reply = httpx.get(f"http://{ip}:8081/admin/fleet", headers=auth, trust_env=False, timeout=5)
        return reply.json()["generation"] if reply.status_code == 200 else -1

    assert wait_until(lambda: generation() == 1, 10, "fleet view 1")
    core.patch_namespaced_config_map("router-fleet", namespace, {"data": fleet(2)})
    assert wait_until(lambda: generation() == 2, 10, "fleet view 2 after the ConfigMap changed")
    core.delete_namespaced_pod("router-0", namespace, grace_period_seconds=0)
    wait_until(lambda: runner.find(namespace, "router-0") is None, 10, "router process stopped")


def test_unsupported_command_is_reported_as_a_container_error(
    runner: LocalPodRunner, core: client.CoreV1Api, namespace: str
):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sglang-0"},
        "spec": {
            "nodeName": NODE,
            "containers": [
                {"name": "engine", "image": "lmsysorg/sglang", "command": ["python", "-m", "sglang.launch_server"]}
            ],
        },
    }
    core.create_namespaced_pod(namespace, pod)

    def waiting_reason() -> str | None:
        statuses = read(core, namespace, "sglang-0")["status"].get("containerStatuses") or []
        return statuses[0]["state"].get("waiting", {}).get("reason") if statuses else None

    assert wait_until(waiting_reason, 10, "container status") == "RunContainerError"
    assert read(core, namespace, "sglang-0")["status"]["phase"] == "Pending"
