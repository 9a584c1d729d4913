"""Pure parts of the router's hardening: engine-internal fields stripped from client bodies, leg timeouts from the
policy, the hold-out of endpoints whose legs timed out, and the limit flags."""

from __future__ import annotations

import json

import pytest

from pdfleet.router import cli, failover, handshake
from pdfleet.router.endpoints import EndpointRegistry
from pdfleet.router.fleet_view import FleetViewError, RoutingPolicy, fleet_view_to_dict, parse_fleet_view
from pdfleet.router.metrics import RouterMetrics

FORGED = {"do_remote_prefill": True, "remote_block_ids": [1], "remote_host": "evil.example", "remote_port": 1}


# ------------------------------------------------------------------------------- engine-internal fields
def test_a_clean_direct_body_is_forwarded_byte_for_byte() -> None:
    original = b'{"model": "m", "prompt": "hi", "stream": true, "vllm_xargs": {"a": 1}}'
    assert handshake.direct_request_body(original, json.loads(original)) is original


@pytest.mark.parametrize(
    "extra, kept",
    [
        ({"kv_transfer_params": FORGED}, {}),
        ({"kv_transfer_params": None}, {}),
        ({"ec_transfer_params": {"remote_host": "evil.example"}}, {}),
        ({"vllm_xargs": {"kv_transfer_params": "x", "ec_transfer_params": 1, "a": 1}}, {"vllm_xargs": {"a": 1}}),
        ({"vllm_xargs": {"kv_transfer_params": "x"}}, {"vllm_xargs": {}}),
    ],
)
def test_the_direct_body_drops_engine_internal_fields(extra: dict, kept: dict) -> None:
    parsed = {"model": "m", "prompt": "hi", **extra}
    forwarded = json.loads(handshake.direct_request_body(json.dumps(parsed).encode(), parsed))
    assert forwarded == {"model": "m", "prompt": "hi", **kept}
    assert parsed == {"model": "m", "prompt": "hi", **extra}  # the parsed request is not modified


def test_duplicate_or_escaped_keys_cannot_smuggle_params() -> None:
    for original in (
        b'{"prompt": "hi", "kv_transfer_params": {"remote_host": "evil"}, "kv_transfer_params": null}',
        b'{"prompt": "hi", "kv_transfer\\u005fparams": {"remote_host": "evil"}}',
    ):
        forwarded = handshake.direct_request_body(original, json.loads(original))
        assert json.loads(forwarded) == {"prompt": "hi"} and b"evil" not in forwarded


def test_prefill_and_decode_bodies_carry_only_the_routers_params() -> None:
    client = {
        "prompt": "p",
        "kv_transfer_params": FORGED,
        "ec_transfer_params": {"x": 1},
        "vllm_xargs": {"kv_transfer_params": "x", "a": 1},
    }
    stage1 = json.loads(handshake.prefill_request_body(client))
    assert stage1["kv_transfer_params"] == handshake.PREFILL_KV_TRANSFER_PARAMS
    assert "ec_transfer_params" not in stage1 and stage1["vllm_xargs"] == {"a": 1}
    original = json.dumps(client).encode()
    stage2 = json.loads(handshake.decode_request_body(original, client, b'{"remote_block_ids":[3]}'))
    assert stage2 == {"prompt": "p", "vllm_xargs": {"a": 1}, "kv_transfer_params": {"remote_block_ids": [3]}}
    only_ec = {"prompt": "p", "ec_transfer_params": {"x": 1}}
    stage2 = json.loads(handshake.decode_request_body(json.dumps(only_ec).encode(), only_ec, b"{}"))
    assert stage2 == {"prompt": "p", "kv_transfer_params": {}}


# ------------------------------------------------------------------------------- leg timeouts
def test_policy_carries_first_byte_and_inter_chunk_timeouts() -> None:
    assert RoutingPolicy().first_byte_timeout_seconds == 12.0  # 4 x 500 ms + 10 s: the default SLA's value
    assert RoutingPolicy().inter_chunk_timeout_seconds == 5.0  # max(5 s, 20 x 50 ms)
    view = parse_fleet_view({"policy": {"firstByteTimeoutSeconds": 3, "interChunkTimeoutSeconds": 1.5}})
    assert (view.policy.first_byte_timeout_seconds, view.policy.inter_chunk_timeout_seconds) == (3.0, 1.5)
    wire = fleet_view_to_dict(view)["policy"]
    assert (wire["firstByteTimeoutSeconds"], wire["interChunkTimeoutSeconds"]) == (3.0, 1.5)
    assert parse_fleet_view(fleet_view_to_dict(view)) == view
    defaults = fleet_view_to_dict(parse_fleet_view({}))["policy"]
    assert "firstByteTimeoutSeconds" not in defaults and "interChunkTimeoutSeconds" not in defaults  # as rendered
    for wire_name in ("firstByteTimeoutSeconds", "interChunkTimeoutSeconds"):
        with pytest.raises(FleetViewError, match="timeouts must be > 0"):
            parse_fleet_view({"policy": {wire_name: 0}})


def test_first_byte_timeout_of_a_reply() -> None:
    # a stream's first chunk comes after the prompt is in: the policy's first-byte timeout
    assert failover.first_byte_timeout(12.0, 5.0, stream=True, max_tokens=4000) == 12.0
    # a non-streamed reply arrives whole: its first byte also waits for every token (inter-chunk / 20 per token)
    assert failover.first_byte_timeout(12.0, 5.0, stream=False, max_tokens=100) == pytest.approx(37.0)
    assert failover.first_byte_timeout(12.0, 5.0, stream=False, max_tokens=None) == 0.0  # unknown length: off
    assert failover.first_byte_timeout(12.0, 5.0, stream=False, max_tokens=True) == 0.0


async def test_a_timed_out_endpoint_is_held_out_with_backoff() -> None:
    registry = EndpointRegistry(timeout_hold_seconds=10.0)
    registry.apply(parse_fleet_view({"endpoints": [{"name": "d", "pool": "decode", "url": "http://127.0.0.1:1"}]}))
    (d,) = registry.decodes
    assert registry.leg_timed_out(d, now=100.0, alive_window=5.0)
    assert not d.healthy and d.hold_until == 110.0
    assert not registry.may_recover(d, now=109.0) and registry.may_recover(d, now=110.0)
    registry.leg_timed_out(d, now=105.0, alive_window=5.0)  # more legs timing out in the same episode
    assert d.hold_until == 110.0
    d.healthy = True  # the health loop let it back, and it hung again: twice as long
    registry.leg_timed_out(d, now=120.0, alive_window=5.0)
    assert d.hold_until == 140.0
    d.pool.last_data = 150.0  # it served again since: the backoff starts over
    registry.leg_timed_out(d, now=200.0, alive_window=5.0)
    assert d.hold_until == 210.0
    # an endpoint that other legs got bytes from a moment ago is busy, not hung: no hold
    d.healthy, d.pool.last_data = True, 299.0
    assert not registry.leg_timed_out(d, now=300.0, alive_window=5.0)
    assert d.healthy and d.hold_until == 210.0
    registry.close()


# ------------------------------------------------------------------------------- limit flags
def test_limit_flags_and_their_defaults() -> None:
    from pdfleet.router.httpserver import ServerLimits

    config = cli.parse_args([])
    assert config.port == 8080
    assert config.limits == ServerLimits(
        max_body_bytes=8 << 20,
        max_header_bytes=16 << 10,
        max_request_line_bytes=8 << 10,
        header_timeout_seconds=10.0,
        body_timeout_seconds=60.0,
        idle_timeout_seconds=60.0,
    )
    assert config.timeout_hold_seconds == 15.0
    assert (config.admin_token_file, config.insecure_admin) == (None, False)
    config = cli.parse_args(
        [
            "--max-body-bytes",
            "1024",
            "--max-header-bytes",
            "2048",
            "--max-request-line-bytes",
            "512",
            "--header-timeout",
            "1.5",
            "--body-timeout",
            "3",
            "--idle-timeout",
            "4",
            "--timeout-hold-seconds",
            "2",
        ]
    )
    assert config.limits == ServerLimits(1024, 2048, 512, 1.5, 3.0, 4.0)
    assert config.timeout_hold_seconds == 2.0
    with pytest.raises(SystemExit):
        cli.parse_args(["--header-timeout", "0"])
    with pytest.raises(SystemExit):  # a token and no token at once
        cli.parse_args(["--admin-token-file", "/t", "--insecure-admin"])


def test_timeouts_and_rejections_are_exported() -> None:
    m = RouterMetrics()
    m.upstream_timeouts[("decode", "first_byte")] += 2
    m.client_rejections["body_too_large"] += 1
    text = m.render().decode()
    assert 'pdfleet_router_upstream_timeouts_total{kind="first_byte",pool="decode"} 2.0' in text
    assert 'pdfleet_router_client_rejections_total{reason="body_too_large"} 1.0' in text
