"""The one fleet-view builder: its output parses back through the router's parser unchanged, pod IPs make valid
URLs (IPv6 bracketed), and the reconcile plan writes the same view to the ConfigMap and to the routers."""

from __future__ import annotations

import json

from pdfleet.api.model import parse_spec
from pdfleet.cluster.observed import PodState, node_summary
from pdfleet.reconcile.plan import plan_reconcile
from pdfleet.render.fleet_view import (
    Endpoint,
    build_fleet_view,
    fleet_endpoints,
    fleet_view_json,
    pod_url,
    url_host,
)
from pdfleet.render.meta import Owner
from pdfleet.render.router import render_router_configmap
from pdfleet.router.fleet_view import (
    RoutingPolicy,
    fleet_view_to_dict,
    load_fleet_view,
    parse_fleet_view,
)

OWNER = Owner(name="llama", namespace="inference", uid="u1")
SPEC = parse_spec(
    {
        "model": {"name": "m", "servedModelName": "llama-70b"},
        "engine": {"port": 8000},
        "router": {
            "policy": {
                "locality": "required",
                "disaggregateMinPromptTokens": 128,
                "prefixAffinity": False,
                "prefixBlockTokens": 32,
                "maxPrefillRetries": 1,
                "maxDecodeRetries": 3,
                "prefillTimeoutSeconds": 30,
                "decodeTimeoutSeconds": 900,
            }
        },
    }
)


def pod(
    name: str,
    pool: str,
    ip: str | None,
    rack: str = "rack-a",
    *,
    ready: bool = True,
    terminating: bool = False,
    component: str | None = None,
) -> PodState:
    return PodState(
        name=name,
        component=component or pool,
        pool=pool,
        rack=rack,
        zone="zone-1",
        cell=name.rsplit("-", 1)[0],
        ip=ip,
        ready=ready,
        phase="Running",
        unschedulable_message=None,
        terminating=terminating,
    )


PODS = [
    pod("llama-prefill-rack-b-0", "prefill", "10.1.2.3", "rack-b"),
    pod("llama-decode-rack-a-0", "decode", "fd00::1"),
    pod("llama-decode-rack-a-1", "decode", "10.1.2.5"),
    pod("llama-prefill-rack-a-0", "prefill", "10.1.2.6"),
    pod("llama-prefill-rack-a-1", "prefill", "10.1.2.7", ready=False),
    pod("llama-decode-rack-b-0", "decode", "10.1.2.8", "rack-b", terminating=True),
    pod("llama-decode-rack-b-1", "decode", None, "rack-b"),
    pod("llama-router-x", "", "10.1.2.9", component="router"),
]


def test_builder_output_round_trips_through_the_router_parser() -> None:
    built = build_fleet_view(
        SPEC, 7, PODS, draining={"llama-decode-rack-a-1"}, previous={"revision": 4, "hash": "an-older-view"}
    )
    assert built.record["revision"] == 5 == built.view["revision"]
    configmap = render_router_configmap(OWNER, built.view)
    assert configmap["data"]["fleet.json"] == built.json
    from_dict = parse_fleet_view(built.view)
    from_text = load_fleet_view(configmap["data"]["fleet.json"])
    assert from_dict == from_text
    assert fleet_view_to_dict(from_text) == built.view  # nothing added, nothing lost
    assert (from_text.version, from_text.generation, from_text.revision, from_text.model) == (1, 7, 5, "llama-70b")
    assert from_text.policy == RoutingPolicy(
        locality="required",
        disaggregate_min_prompt_tokens=128,
        prefix_affinity=False,
        prefix_block_tokens=32,
        max_prefill_retries=1,
        max_decode_retries=3,
        prefill_timeout_seconds=30.0,
        decode_timeout_seconds=900.0,
    )
    assert [(e.name, e.pool, e.url, e.rack, e.zone, e.draining) for e in from_text.endpoints] == [
        ("llama-decode-rack-a-0", "decode", "http://[fd00::1]:8000", "rack-a", "zone-1", False),
        ("llama-decode-rack-a-1", "decode", "http://10.1.2.5:8000", "rack-a", "zone-1", True),
        ("llama-prefill-rack-a-0", "prefill", "http://10.1.2.6:8000", "rack-a", "zone-1", False),
        ("llama-prefill-rack-b-0", "prefill", "http://10.1.2.3:8000", "rack-b", "zone-1", False),
    ]


def test_ipv6_pod_ips_are_bracketed_and_ipv4_ones_unchanged() -> None:
    assert url_host("fd00::1") == "[fd00::1]" and url_host("10.1.2.3") == "10.1.2.3"
    assert pod_url("fd00::1", 8000) == "http://[fd00::1]:8000"
    v6, v4 = fleet_endpoints([pod("d-0", "decode", "fd00::1"), pod("p-0", "prefill", "10.1.2.3")], 8000)
    assert v6 == Endpoint("d-0", "decode", "http://[fd00::1]:8000", "rack-a", "zone-1")
    assert v4 == Endpoint("p-0", "prefill", "http://10.1.2.3:8000", "rack-a", "zone-1")
    parsed = load_fleet_view(build_fleet_view(SPEC, 1, [pod("d-0", "decode", "fd00::1")]).json)
    (endpoint,) = parsed.endpoints
    assert (endpoint.url, endpoint.host, endpoint.port) == ("http://[fd00::1]:8000", "fd00::1", 8000)
    from_pod = {"metadata": {"name": "p-0", "labels": {"pdfleet.dev/pool": "prefill"}}, "status": {"podIP": "10.1.2.3"}}
    assert Endpoint.from_pod(from_pod, 8000).url == "http://10.1.2.3:8000"


def test_revision_rises_by_one_only_when_the_content_changes() -> None:
    first = build_fleet_view(SPEC, 7, PODS)
    assert first.record["revision"] == 1
    again = build_fleet_view(SPEC, 7, list(reversed(PODS)), previous=first.record)
    assert again == first
    drained = build_fleet_view(SPEC, 7, PODS, draining={"llama-decode-rack-a-0"}, previous=again.record)
    assert drained.record["revision"] == 2 and drained.record["hash"] != first.record["hash"]
    assert fleet_view_json(drained.view) == drained.json


def node(name: str, rack: str) -> dict:
    return node_summary(
        {
            "metadata": {
                "name": name,
                "labels": {
                    "topology.pdfleet.dev/rack": rack,
                    "topology.kubernetes.io/zone": "zone-1",
                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                },
            },
            "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]},
        }
    )


def test_the_plan_writes_and_pushes_the_same_view() -> None:
    body = {
        "metadata": {"name": "llama", "namespace": "inference", "uid": "u1", "generation": 3},
        "spec": {
            "model": {"name": "m", "servedModelName": "llama-70b"},
            "engine": {"kind": "vllm", "image": "vllm/vllm-openai:v0.32.0"},
            "prefill": {"replicas": 2, "gpusPerReplica": 1},
            "decode": {"replicas": 2, "gpusPerReplica": 1},
        },
        "status": {"drain": {"pool": "decode", "targetReplicas": 1, "endpoints": ["llama-decode-rack-a-1"]}},
    }
    result = plan_reconcile(
        pdd=body,
        nodes=[node("a0", "rack-a"), node("b0", "rack-b")],
        children=[],
        pods=PODS,
        pdb_api_version="policy/v1",
        operator_image="img",
        now="2026-12-02T00:00:00Z",
    )
    assert result.router_view is not None
    text = next(o for o in result.applies if o["kind"] == "ConfigMap")["data"]["fleet.json"]
    assert json.loads(text) == result.router_view.view
    assert fleet_view_json(result.router_view.view) == text
    pushed = load_fleet_view(json.dumps(result.router_view.view))  # the body router_admin.push_fleet_view PUTs
    assert pushed == load_fleet_view(text)
    assert pushed.revision == result.status["fleetView"]["revision"] == 1
    assert [(e.url, e.draining) for e in pushed.pool("decode")] == [
        ("http://[fd00::1]:8000", False),
        ("http://10.1.2.5:8000", True),
    ]


def test_leg_timeouts_follow_the_sla_unless_overridden() -> None:
    from pdfleet.render.fleet_view import leg_timeouts

    base = {"model": {"name": "m", "servedModelName": "llama-70b"}}
    # the default SLA's values are the router's defaults: the view leaves them out (the router assumes them)
    default = parse_spec(base)
    assert leg_timeouts(default) == (12.0, 5.0)
    assert (RoutingPolicy().first_byte_timeout_seconds, RoutingPolicy().inter_chunk_timeout_seconds) == (12.0, 5.0)
    policy = build_fleet_view(default, 1, PODS).view["policy"]
    assert "firstByteTimeoutSeconds" not in policy and "interChunkTimeoutSeconds" not in policy
    # a slower SLA: first byte 4 x ttft + 10 s, inter-chunk 20 x tpot (at least 5 s)
    slow = parse_spec({**base, "sla": {"ttftMs": 2000, "tpotMs": 400}})
    assert leg_timeouts(slow) == (18.0, 8.0)
    built = build_fleet_view(slow, 1, PODS)
    assert (built.view["policy"]["firstByteTimeoutSeconds"], built.view["policy"]["interChunkTimeoutSeconds"]) == (
        18.0,
        8.0,
    )
    parsed = load_fleet_view(built.json).policy
    assert (parsed.first_byte_timeout_seconds, parsed.inter_chunk_timeout_seconds) == (18.0, 8.0)
    assert fleet_view_to_dict(load_fleet_view(built.json)) == built.view
    # spec.router.policy overrides win
    pinned = parse_spec(
        {
            **base,
            "sla": {"ttftMs": 2000},
            "router": {"policy": {"firstByteTimeoutSeconds": 3, "interChunkTimeoutSeconds": 1.5}},
        }
    )
    assert leg_timeouts(pinned) == (3.0, 1.5)
    parsed = load_fleet_view(build_fleet_view(pinned, 1, PODS).json).policy
    assert (parsed.first_byte_timeout_seconds, parsed.inter_chunk_timeout_seconds) == (3.0, 1.5)
