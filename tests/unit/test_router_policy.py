"""Routing choices (pdfleet.router.policy): pure, no sockets."""

from __future__ import annotations

from dataclasses import dataclass

from pdfleet.router.policy import (
    CROSS_ZONE,
    SAME_RACK,
    SAME_ZONE,
    PrefixAffinity,
    affinity_load_bound,
    choose_decode,
    choose_direct_decode,
    choose_prefill,
    estimate_prompt_tokens,
    least_loaded,
    locality_of,
    prefix_block_hashes,
    prompt_of,
    should_disaggregate,
)


@dataclass
class E:
    name: str
    rack: str = ""
    zone: str = ""
    healthy: bool = True
    draining: bool = False
    inflight: int = 0


def test_token_estimate_is_chars_over_four_plus_chat_overhead() -> None:
    body = {"prompt": "x" * 1001}
    assert estimate_prompt_tokens(body, prompt_of(body)) == 251
    chat = {"messages": [{"role": "user", "content": "y" * 40}, {"role": "system", "content": [{"text": "z" * 8}]}]}
    prompt = prompt_of(chat)
    assert prompt == "<user>" + "y" * 40 + "<system>" + "z" * 8
    assert estimate_prompt_tokens(chat, prompt) == -(-len(prompt) // 4) + 8
    ids = {"prompt": [1, 2, 3]}
    assert estimate_prompt_tokens(ids, prompt_of(ids)) == 3
    assert prompt_of({"prompt": ["first", "second"]}) == "first"
    assert prompt_of({}) == "" and prompt_of({"prompt": 5}) == ""


def test_short_prompts_go_direct() -> None:
    prefills = [E("p1")]
    assert not should_disaggregate(255, 256, prefills)
    assert should_disaggregate(256, 256, prefills)
    assert should_disaggregate(0, 0, prefills)


def test_a_prefill_pool_at_zero_or_draining_to_it_serves_every_prompt_whole() -> None:
    assert not should_disaggregate(10_000, 256, [])
    assert not should_disaggregate(10_000, 256, [E("p1", draining=True)])
    # an unhealthy prefill is a failure the prefill leg handles (retries, then the fallback), not the fleet's shape
    assert should_disaggregate(10_000, 256, [E("p1", healthy=False)])


def test_prefix_hashes_chain_over_full_blocks() -> None:
    a = prefix_block_hashes("a" * 256 + "b" * 256 + "c" * 100, 64)  # 256 chars per 64-token block
    b = prefix_block_hashes("a" * 256 + "X" * 256, 64)
    assert len(a) == 2 and len(b) == 2
    assert a[0] == b[0] and a[1] != b[1]
    assert prefix_block_hashes("short", 64) == ()
    assert len(prefix_block_hashes(list(range(200)), 64)) == 3
    assert len(prefix_block_hashes("q" * 100_000, 1)) == 16  # bounded work for huge prompts


def test_affinity_prefers_longest_known_prefix_and_is_bounded() -> None:
    aff = PrefixAffinity(capacity=3)
    aff.record((1, 2), "p0")
    aff.record((1, 2, 3), "p1")
    assert aff.lookup((1, 2, 3, 4)) == "p1"
    assert aff.lookup((1, 9)) == "p1"  # hash 1 was re-recorded by p1
    assert aff.lookup((7,)) is None
    aff.record((5,), "p2")
    assert len(aff) == 3 and aff.lookup((1,)) is None  # least recently recorded evicted


def test_prefill_keeps_affinity_until_overloaded() -> None:
    p0, p1 = E("p0", inflight=3), E("p1", inflight=2)
    assert affinity_load_bound(2) == 3
    assert choose_prefill([p0, p1], set(), "p0", 0) is p0
    p0.inflight = 4
    assert choose_prefill([p0, p1], set(), "p0", 0) is p1
    assert choose_prefill([p0, p1], set(), None, 0) is p1


def test_prefill_skips_draining_unhealthy_and_excluded() -> None:
    p0, p1, p2 = E("p0", draining=True), E("p1", healthy=False), E("p2", inflight=50)
    assert choose_prefill([p0, p1, p2], set(), "p0", 0) is p2
    assert choose_prefill([p0, p1, p2], {"p2"}, None, 0) is None


def test_ties_rotate_with_the_tiebreak() -> None:
    cands = [E("a"), E("b"), E("c", inflight=1)]
    assert [least_loaded(cands, t).name for t in range(4)] == ["a", "b", "a", "b"]
    assert least_loaded([], 0) is None


def test_locality_classes() -> None:
    p = E("p", rack="r1", zone="z1")
    assert locality_of(p, E("d", rack="r1", zone="z1")) == SAME_RACK
    assert locality_of(p, E("d", rack="r2", zone="z1")) == SAME_ZONE
    assert locality_of(p, E("d", rack="r3", zone="z2")) == CROSS_ZONE
    assert locality_of(E("p"), E("d")) == CROSS_ZONE  # unknown racks never count as the same


def test_decode_locality_required_preferred_any() -> None:
    p = E("p", rack="r1", zone="z1")
    same_rack_busy = E("d1", rack="r1", zone="z1", inflight=9)
    same_zone = E("d2", rack="r2", zone="z1")
    far = E("d3", rack="r3", zone="z2")
    decodes = [same_rack_busy, same_zone, far]
    assert choose_decode(decodes, p, "required", set(), 0) == (same_rack_busy, SAME_RACK)
    assert choose_decode(decodes, p, "preferred", set(), 0) == (same_rack_busy, SAME_RACK)
    assert choose_decode(decodes, p, "any", set(), 0) == (same_zone, SAME_ZONE)
    same_rack_busy.draining = True
    assert choose_decode(decodes, p, "required", set(), 0) == (None, SAME_RACK)
    assert choose_decode(decodes, p, "preferred", set(), 0) == (same_zone, SAME_ZONE)
    assert choose_decode(decodes, p, "preferred", {"d2"}, 0) == (far, CROSS_ZONE)
    assert choose_decode(decodes, p, "preferred", {"d2", "d3"}, 0)[0] is None
    assert choose_decode([], p, "any", set(), 0)[0] is None


def test_direct_decode_is_least_loaded_eligible() -> None:
    d1, d2, d3 = E("d1", inflight=3), E("d2", inflight=1, healthy=False), E("d3", inflight=2)
    assert choose_direct_decode([d1, d2, d3], set(), 0) is d3
    assert choose_direct_decode([d1, d2, d3], {"d3"}, 0) is d1
