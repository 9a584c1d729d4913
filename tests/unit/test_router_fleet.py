"""Fleet view parsing (pdfleet.router.fleet_view)."""

from __future__ import annotations

import json

import pytest

from pdfleet.router.fleet_view import (
    FleetViewError,
    RoutingPolicy,
    fleet_view_to_dict,
    load_fleet_view,
    parse_fleet_view,
)

VIEW = {
    "version": 1,
    "generation": 7,
    "model": "llama-70b",
    "policy": {
        "locality": "required",
        "disaggregateMinPromptTokens": 128,
        "prefixAffinity": False,
        "prefixBlockTokens": 32,
        "maxPrefillRetries": 1,
        "maxDecodeRetries": 3,
        "prefillTimeoutSeconds": 5,
        "decodeTimeoutSeconds": 30,
    },
    "endpoints": [
        {
            "name": "p-a-0",
            "pool": "prefill",
            "url": "http://10.1.2.3:8000",
            "rack": "rack-a",
            "zone": "zone-1",
            "draining": False,
        },
        {
            "name": "d-a-0",
            "pool": "decode",
            "url": "http://10.1.2.4:8000/",
            "rack": "rack-a",
            "zone": "zone-1",
            "draining": True,
        },
    ],
}


def test_parses_the_documented_view() -> None:
    view = parse_fleet_view(VIEW)
    assert (view.version, view.generation, view.model) == (1, 7, "llama-70b")
    assert view.policy == RoutingPolicy("required", 128, False, 32, 1, 3, 5.0, 30.0)
    prefill, decode = view.endpoints
    assert (prefill.host, prefill.port, prefill.rack, prefill.zone) == ("10.1.2.3", 8000, "rack-a", "zone-1")
    assert decode.url == "http://10.1.2.4:8000" and decode.draining
    assert view.pool("decode") == (decode,)


def test_missing_policy_takes_crd_defaults() -> None:
    view = parse_fleet_view({"endpoints": []})
    assert view.policy == RoutingPolicy()
    assert view.policy.disaggregate_min_prompt_tokens == 256 and view.policy.locality == "preferred"


def test_round_trip_through_wire_form() -> None:
    view = parse_fleet_view(VIEW)
    assert parse_fleet_view(json.loads(json.dumps(fleet_view_to_dict(view)))) == view


@pytest.mark.parametrize(
    "change, message",
    [
        ({"policy": {"locality": "nearby"}}, "locality"),
        ({"policy": {"maxDecodeRetries": -1}}, "max_decode_retries"),
        ({"policy": {"prefixAffinity": "yes"}}, "boolean"),
        ({"policy": {"prefixBlockTokens": 0}}, "prefixBlockTokens"),
        ({"endpoints": [{"name": "x", "pool": "both", "url": "http://h:1"}]}, "pool"),
        ({"endpoints": [{"name": "x", "pool": "decode", "url": "https://h:1"}]}, "url"),
        ({"endpoints": [{"name": "", "pool": "decode", "url": "http://h:1"}]}, "name"),
        ({"endpoints": [{"name": "x", "pool": "decode", "url": "http://h:1"}] * 2}, "unique"),
        ({"endpoints": "none"}, "list"),
    ],
)
def test_rejects_contract_violations(change: dict, message: str) -> None:
    with pytest.raises(FleetViewError, match=message):
        parse_fleet_view({**VIEW, **change})


def test_load_rejects_bad_json() -> None:
    with pytest.raises(FleetViewError, match="not valid JSON"):
        load_fleet_view(b"{nope")
    assert load_fleet_view(json.dumps(VIEW).encode()).generation == 7


def test_views_are_ordered_by_generation_then_revision() -> None:
    def at(generation: int, revision: int):
        return parse_fleet_view({**VIEW, "generation": generation, "revision": revision})

    assert at(7, 4).older_than(at(7, 5)) and not at(7, 5).older_than(at(7, 5))
    assert at(6, 9).older_than(at(7, 1))  # a PDDeployment whose revision count was lost recovers at its next change
    assert not at(7, 1).older_than(None)
    assert not at(7, 0).older_than(at(7, 5)) and not at(7, 4).older_than(at(7, 0))  # hand-written views: no order
    assert fleet_view_to_dict(at(7, 4))["revision"] == 4
