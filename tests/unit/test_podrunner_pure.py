"""Pure helpers of the local pod runner: command mapping, env, probes, mounts, backoff, grace, reported status."""

from __future__ import annotations

import sys
from pathlib import Path

from pdfleet.localfleet.podrunner import (
    ContainerView,
    Probe,
    claim_address_block,
    grace_seconds,
    local_argv,
    node_env,
    pod_ip,
    pod_status,
    readiness_probe,
    resolve_env,
    restart_backoff,
    rewrite_mount_paths,
)

POD = {"metadata": {"name": "llama-prefill-rack-a-0", "namespace": "inference"}, "spec": {"nodeName": "rack-a-node-0"}}


def test_pod_ips_are_loopback_addresses_counted_up_from_127_1_0_1():
    assert [pod_ip(i) for i in (0, 1, 255)] == ["127.1.0.1", "127.1.0.2", "127.1.1.0"]


def test_each_runner_claims_its_own_address_block_until_it_lets_go():
    first, first_claim = claim_address_block()
    second, second_claim = claim_address_block()
    try:
        assert first != second
        assert pod_ip(0, second) == f"127.{1 + second}.0.1"
    finally:
        second_claim.close()
    third, third_claim = claim_address_block()
    third_claim.close()
    first_claim.close()
    assert third == second


def test_vllm_serve_becomes_the_emulator_bound_to_the_pod_ip():
    argv = local_argv(["vllm", "serve", "m", "--port", "8000"], "127.1.0.9")
    assert argv == [sys.executable, "-m", "pdfleet", "engine", "serve", "m", "--port", "8000", "--host", "127.1.0.9"]


def test_pdfleet_commands_run_in_this_interpreter_and_anything_else_is_unsupported():
    assert local_argv(["/usr/bin/pdfleet", "router", "--port", "8080"], "127.1.0.2")[3:] == [
        "router",
        "--port",
        "8080",
        "--host",
        "127.1.0.2",
    ]
    assert local_argv(["python", "-m", "sglang.launch_server"], "127.1.0.2") is None
    assert local_argv([], "127.1.0.2") is None


def test_env_fills_values_and_downward_api_fields():
    container = {
        "env": [
            {"name": "A", "value": "1"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {
                "name": "POD_NAMESPACE",
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}},
            },
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        ]
    }
    assert resolve_env(container, POD, "127.1.0.3") == {
        "A": "1",
        "POD_NAME": "llama-prefill-rack-a-0",
        "POD_NAMESPACE": "inference",
        "POD_IP": "127.1.0.3",
        "NODE": "rack-a-node-0",
    }


def test_engines_learn_their_gpu_from_the_node_product_label():
    assert node_env({"nvidia.com/gpu.product": "NVIDIA-L4"}) == {"PDFLEET_EMULATOR_GPU": "NVIDIA-L4"}
    assert node_env({}) == {}


def test_readiness_probe_resolves_named_ports_and_keeps_period_and_threshold():
    container = {
        "ports": [{"name": "admin", "containerPort": 8081}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "admin"}, "periodSeconds": 2, "failureThreshold": 5},
    }
    assert readiness_probe(container, "127.1.0.4") == Probe("http://127.1.0.4:8081/ready", 2.0, 5)
    assert readiness_probe({"readinessProbe": {"httpGet": {"port": 9000}}}, "127.1.0.4").url == "http://127.1.0.4:9000/"
    assert readiness_probe({}, "127.1.0.4") is None


def test_arguments_under_a_mount_point_at_the_local_copy():
    mounts = {"/etc/pdfleet": Path("/tmp/v/fleet"), "/etc": Path("/tmp/v/etc")}
    assert rewrite_mount_paths(
        ["--fleet-file", "/etc/pdfleet/fleet.json", "/etc/x", "/etcetera", "/etc/pdfleet"], mounts
    ) == ["--fleet-file", "/tmp/v/fleet/fleet.json", "/tmp/v/etc/x", "/etcetera", "/tmp/v/fleet"]


def test_restart_backoff_doubles_and_is_capped():
    assert [restart_backoff(n) for n in (1, 2, 3, 4, 5, 20)] == [1, 2, 4, 8, 10, 10]


def test_grace_period_comes_from_the_deletion_then_the_spec_and_is_capped():
    assert grace_seconds({"metadata": {"deletionGracePeriodSeconds": 5}, "spec": {}}) == 5
    assert grace_seconds({"metadata": {}, "spec": {"terminationGracePeriodSeconds": 3}}) == 3
    assert grace_seconds({"metadata": {"deletionGracePeriodSeconds": 600}, "spec": {}}) == 30
    assert grace_seconds({"metadata": {"deletionGracePeriodSeconds": 0}, "spec": {}}) == 0


def _view(**changes) -> ContainerView:
    base = dict(
        ip="127.1.0.5",
        name="engine",
        image="vllm/vllm-openai:v0.32.0",
        supported=True,
        running=True,
        ready=True,
        restarts=0,
        started_at="2025-01-01T00:00:00Z",
    )
    return ContainerView(**{**base, **changes})


def _condition(status: dict, kind: str) -> str:
    return next(c["status"] for c in status["conditions"] if c["type"] == kind)


def test_status_of_a_running_ready_container():
    status = pod_status(_view(), "now")
    assert status["phase"] == "Running" and status["podIP"] == "127.1.0.5" and status["podIPs"] == [{"ip": "127.1.0.5"}]
    assert _condition(status, "Ready") == "True" and _condition(status, "ContainersReady") == "True"
    container = status["containerStatuses"][0]
    assert container["state"] == {"running": {"startedAt": "2025-01-01T00:00:00Z"}} and container["restartCount"] == 0
    assert "lastState" not in container


def test_status_while_starting_crashlooping_and_unsupported():
    starting = pod_status(_view(running=False, ready=False), "now")
    assert starting["phase"] == "Pending" and _condition(starting, "Ready") == "False"
    assert starting["containerStatuses"][0]["state"]["waiting"]["reason"] == "ContainerCreating"
    crashed = pod_status(_view(running=False, ready=False, restarts=2, last_exit_code=137), "now")
    assert crashed["phase"] == "Running"
    assert crashed["containerStatuses"][0]["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert crashed["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 137
    unsupported = pod_status(_view(supported=False, running=False, ready=False), "now")
    assert unsupported["containerStatuses"][0]["state"]["waiting"]["reason"] == "RunContainerError"
