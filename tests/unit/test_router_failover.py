"""Failure-path decisions (pdfleet.router.failover)."""

from __future__ import annotations

import pytest

from pdfleet.router.failover import MARKS_UNHEALTHY, Action, Decision, Outcome, after_decode, after_prefill, fail_status

RETRYABLE = (Outcome.CONNECT_FAILED, Outcome.TIMEOUT, Outcome.UPSTREAM_5XX, Outcome.BAD_HANDSHAKE)


@pytest.mark.parametrize("outcome", RETRYABLE)
def test_prefill_failure_retries_then_falls_back(outcome: Outcome) -> None:
    assert after_prefill(outcome, 0, 2).action is Action.RETRY
    assert after_prefill(outcome, 1, 2).action is Action.RETRY
    assert after_prefill(outcome, 2, 2).action is Action.FALLBACK
    assert after_prefill(outcome, 0, 0).action is Action.FALLBACK


def test_prefill_success_client_error_and_client_gone() -> None:
    assert after_prefill(Outcome.OK, 0, 2) == Decision(Action.DONE)
    assert after_prefill(Outcome.UPSTREAM_4XX, 0, 2).action is Action.PASS_THROUGH
    assert after_prefill(Outcome.CLIENT_GONE, 0, 2).action is Action.ABANDON


@pytest.mark.parametrize("outcome", (Outcome.CONNECT_FAILED, Outcome.TIMEOUT, Outcome.UPSTREAM_5XX))
def test_disaggregated_decode_failure_retries_then_falls_back(outcome: Outcome) -> None:
    assert after_decode(outcome, 0, 1, can_fall_back=True).action is Action.RETRY
    assert after_decode(outcome, 1, 1, can_fall_back=True).action is Action.FALLBACK


def test_direct_decode_failure_ends_in_a_named_status() -> None:
    assert after_decode(Outcome.TIMEOUT, 1, 1, can_fall_back=False) == Decision(Action.FAIL, 504)
    assert after_decode(Outcome.CONNECT_FAILED, 1, 1, can_fall_back=False) == Decision(Action.FAIL, 502)
    assert after_decode(Outcome.UPSTREAM_5XX, 0, 1, can_fall_back=False).action is Action.RETRY


def test_mid_stream_death_is_never_retried() -> None:
    assert after_decode(Outcome.DIED_MID_STREAM, 0, 5, can_fall_back=True).action is Action.ABANDON
    assert after_decode(Outcome.UPSTREAM_4XX, 0, 5, can_fall_back=True).action is Action.PASS_THROUGH


def test_statuses_and_health_marking() -> None:
    assert fail_status(Outcome.TIMEOUT) == 504 and fail_status(Outcome.UPSTREAM_5XX) == 502
    assert Outcome.CONNECT_FAILED in MARKS_UNHEALTHY and Outcome.UPSTREAM_5XX not in MARKS_UNHEALTHY
