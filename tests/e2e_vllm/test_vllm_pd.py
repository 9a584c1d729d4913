"""A PDDeployment of one prefill and one decode real vLLM, applied to the local control plane, serving through the
router: disaggregated answers are token-identical to a colocated engine's, vLLM itself counts every NIXL transfer (no
silent fallback to recompute), and a prefill killed mid-request costs no request."""

from __future__ import annotations

import concurrent.futures
import json
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdfleet.localfleet import real_vllm
from pdfleet.localfleet.harness import LocalFleet
from pdfleet.render.fleet_view import pod_url

NAME = "tiny-pd"
PROMPTS = (
    "The quick brown fox",
    "Kubernetes schedules pods onto nodes that",
    "Prefill and decode run on separate pools because",
    "A rack holds",
    "GNU GENERAL PUBLIC LICENSE Version 3, 29 June 2007. Everyone is permitted to copy and distribute",
)
LONG_PROMPT = " ".join(["the program is free software you can redistribute it and or modify it"] * 40)
TIMEOUT = httpx.Timeout(60.0, connect=5.0)
pytestmark = pytest.mark.timeout(600)  # the first test also waits for two real engines to load


def pd_pdd(namespace: str, prometheus_url: str) -> dict[str, Any]:
    """1 prefill + 1 decode of the tiny Llama; every prompt is disaggregated (disaggregateMinPromptTokens 0)."""
    pool = {"replicas": 1, "gpusPerReplica": 1, "gpuProduct": "NVIDIA-L4"}
    return {
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            **real_vllm.pdd_spec_fields(disaggregateMinPromptTokens=0, locality="required"),
            "prefill": dict(pool),
            "decode": dict(pool),
            "sla": {"ttftMs": 2000, "tpotMs": 500},
            "prometheus": {"url": prometheus_url},
        },
    }


@pytest.fixture(scope="module")
def pd_fleet(vllm_fleet: LocalFleet, vllm_namespace: str) -> tuple[LocalFleet, str]:
    assert vllm_fleet.prometheus is not None
    vllm_fleet.apply(pd_pdd(vllm_namespace, vllm_fleet.prometheus.url))
    vllm_fleet.wait_serving(vllm_namespace, NAME, timeout=420)
    return vllm_fleet, vllm_namespace


def engine_url(fleet: LocalFleet, namespace: str, pool: str) -> str:
    (pod,) = [p for p in fleet.pods(namespace, NAME, pool) if p["status"].get("podIP")]
    return pod_url(pod["status"]["podIP"], 8000)


def complete(base_url: str, prompt: str, max_tokens: int = 16) -> str:
    body = {"model": real_vllm.SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    reply = httpx.post(base_url + "/v1/completions", json=body, timeout=TIMEOUT, trust_env=False)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["text"]


def streamed_chat(base_url: str, content: str) -> str:
    body = {
        "model": real_vllm.SERVED_MODEL_NAME,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 16,
        "temperature": 0,
        "stream": True,
    }
    text = []
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=TIMEOUT, trust_env=False) as reply:
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    text.append(choice.get("delta", {}).get("content") or "")
    return "".join(text)


def metric(base_url: str, sample: str, **labels: str) -> float:
    """Sum of the samples named `sample` on an engine's /metrics whose labels include `labels`."""
    reply = httpx.get(base_url + "/metrics", timeout=TIMEOUT, trust_env=False)
    return sum(
        s.value
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
        if s.name == sample and labels.items() <= s.labels.items()
    )


def test_disaggregated_answers_are_token_identical_and_vllm_counts_each_nixl_transfer(pd_fleet):
    fleet, namespace = pd_fleet
    router, decode = fleet.router_url(namespace, NAME), engine_url(fleet, namespace, "decode")
    prefill = engine_url(fleet, namespace, "prefill")
    transfers_before = metric(decode, "vllm:nixl_xfer_time_seconds_count")
    prefills_before = metric(prefill, "vllm:prompt_tokens_total")
    external_before = metric(decode, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")

    for prompt in PROMPTS:
        # The decode engine called directly computes the prompt itself: a colocated answer from the same weights.
        assert complete(router, prompt) == complete(decode, prompt), prompt
    assert streamed_chat(router, PROMPTS[0]) == streamed_chat(decode, PROMPTS[0])

    transfers = metric(decode, "vllm:nixl_xfer_time_seconds_count") - transfers_before
    assert transfers >= len(PROMPTS) + 1, f"{transfers} NIXL transfers for {len(PROMPTS) + 1} disaggregated requests"
    assert metric(decode, "vllm:nixl_num_failed_transfers_total") == 0
    assert metric(prefill, "vllm:prompt_tokens_total") > prefills_before  # the prefill did the prompt work
    external = metric(decode, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") - external_before
    assert external > 0, "the decode computed every prompt itself: no KV arrived over NIXL"


def test_killing_the_prefill_mid_request_still_completes_every_request(pd_fleet):
    fleet, namespace = pd_fleet
    router, decode = fleet.router_url(namespace, NAME), engine_url(fleet, namespace, "decode")
    prompts = [f"{LONG_PROMPT} {i}" for i in range(6)]
    expected = {prompt: complete(decode, prompt, max_tokens=32) for prompt in prompts}
    (prefill_pod,) = fleet.pods(namespace, NAME, "prefill")
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        futures = {pool.submit(complete, router, prompt, 32): prompt for prompt in prompts}
        assert fleet.kill_pod_process(namespace, prefill_pod["metadata"]["name"])
        answers = {futures[f]: f.result(timeout=120) for f in concurrent.futures.as_completed(futures, timeout=150)}
    assert answers == expected
    # and the fleet keeps serving while the prefill restarts: straight to the decode, re-prefilling there
    assert complete(router, PROMPTS[1]) == complete(decode, PROMPTS[1])
