"""The router's one retry loop (pdfleet.router.proxy.Retries), driven with fake endpoints and fake leg attempts."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from pdfleet.router import policy
from pdfleet.router.failover import Action, Decision, Outcome, after_decode, after_prefill
from pdfleet.router.metrics import RouterMetrics
from pdfleet.router.proxy import Retries


@dataclass
class Endpoint:
    name: str
    rack: str = ""
    zone: str = ""
    healthy: bool = True
    draining: bool = False
    inflight: int = 0


def fleet(*names: str) -> list[Endpoint]:
    return [Endpoint(n) for n in names]


def picker(endpoints: list[Endpoint], picked: list[str]):
    def pick(tried: set[str]) -> Endpoint | None:
        chosen = policy.choose_direct_decode(endpoints, tried, 0)
        if chosen is not None:
            picked.append(chosen.name)
        return chosen

    return pick


def attempts(*outcomes: Outcome):
    """An attempt that ends with the given outcomes in turn; its result is the attempt's number."""
    ends = iter(enumerate(outcomes))

    async def attempt(endpoint: Endpoint) -> tuple[Outcome, int]:
        number, outcome = next(ends)
        return outcome, number

    return attempt


async def test_retries_on_untried_endpoints_then_gives_up() -> None:
    metrics, picked = RouterMetrics(), []
    endpoints = fleet("a", "b", "c", "d")
    retries = Retries("prefill", partial(after_prefill, max_retries=2), metrics)
    ended = await retries.run(picker(endpoints, picked), attempts(*[Outcome.UPSTREAM_5XX] * 3))
    assert ended == (endpoints[2], 2, Decision(Action.FALLBACK))
    assert picked == ["a", "b", "c"] and retries.tried == {"a", "b"}
    assert metrics.retries == {"prefill": 2}
    assert all(e.healthy for e in endpoints)  # a 5xx may concern only this request


async def test_success_after_a_retry_returns_that_endpoint_and_its_result() -> None:
    metrics, picked = RouterMetrics(), []
    endpoints = fleet("a", "b")
    retries = Retries("decode", partial(after_decode, max_retries=2, can_fall_back=True), metrics)
    ended = await retries.run(picker(endpoints, picked), attempts(Outcome.CONNECT_FAILED, Outcome.OK))
    assert ended == (endpoints[1], 1, Decision(Action.DONE))
    assert [e.healthy for e in endpoints] == [False, True]  # connection-level failure: marked unhealthy
    assert metrics.retries == {"decode": 1}


async def test_no_endpoint_left_ends_with_none_and_names_the_tried() -> None:
    metrics, picked = RouterMetrics(), []
    endpoints = fleet("a", "b")
    retries = Retries("decode", partial(after_decode, max_retries=5, can_fall_back=False), metrics)
    ended = await retries.run(picker(endpoints, picked), attempts(Outcome.TIMEOUT, Outcome.TIMEOUT))
    assert ended is None
    assert retries.tried == {"a", "b"} and metrics.retries == {"decode": 2}
    assert not any(e.healthy for e in endpoints)


async def test_exhausted_direct_leg_fails_with_the_status_of_its_last_outcome() -> None:
    retries = Retries("decode", partial(after_decode, max_retries=1, can_fall_back=False), RouterMetrics())
    ended = await retries.run(picker(fleet("a", "b", "c"), []), attempts(Outcome.CONNECT_FAILED, Outcome.TIMEOUT))
    assert ended is not None and ended[2] == Decision(Action.FAIL, 504)


async def test_final_outcomes_are_never_retried() -> None:
    for outcome, action in (
        (Outcome.DIED_MID_STREAM, Action.ABANDON),
        (Outcome.CLIENT_GONE, Action.ABANDON),
        (Outcome.UPSTREAM_4XX, Action.PASS_THROUGH),
    ):
        metrics = RouterMetrics()
        endpoints = fleet("a", "b")
        retries = Retries("decode", partial(after_decode, max_retries=5, can_fall_back=True), metrics)
        ended = await retries.run(picker(endpoints, []), attempts(outcome))
        assert ended == (endpoints[0], 0, Decision(action))
        assert not retries.tried and not metrics.retries
        assert endpoints[0].healthy is (outcome is not Outcome.DIED_MID_STREAM)
