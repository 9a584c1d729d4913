"""Partial metrics: some queries answer for a pool, others do not. The autoscaler names what is missing (per pool)
and holds; it never scales on half a reading."""

from __future__ import annotations

from pdfleet.api.model import parse_spec
from pdfleet.autoscale.promql import Signal
from pdfleet.autoscale.signals import PoolSignals, signals_from_results
from pdfleet.autoscale.step import plan_autoscale
from pdfleet.cluster.observed import node_summary
from pdfleet.reconcile.plan import plan_reconcile
from pdfleet.testing.builders import fleet_spec, node_body
from pdfleet.topology.inventory import node_info

T0 = 1_800_000_000.0
SCALING = {
    "enabled": True,
    "minReplicas": 1,
    "maxReplicas": 8,
    "scaleDownStabilizationSeconds": 0,
    "capacityTokensPerSecond": 1000,
}


def _vector(**by_pool: str) -> list[dict]:
    return [{"metric": {"pool": pool}, "value": [T0, value]} for pool, value in by_pool.items()]


def _results(**leave_out: tuple[str, ...]) -> dict[Signal, list[dict]]:
    """Every query answered for both pools, hot enough to scale both up, except the (signal -> pools) left out."""
    values = {
        Signal.TTFT_P: ("2.0", "NaN"),  # prefill 4x over its 500 ms TTFT target; decode served no first token
        Signal.ITL_P: ("NaN", "0.2"),  # decode 4x over its 50 ms TPOT target
        Signal.QUEUE_TOTAL: ("40", "40"),
        Signal.RUNNING_TOTAL: ("8", "64"),
        Signal.KV_USAGE: ("0.5", "0.9"),
        Signal.PROMPT_TPS: ("8000", "0"),
        Signal.GEN_TPS: ("10", "8000"),
        Signal.REQUEST_RATE: ("10", "10"),
        Signal.REPLICAS_REPORTING: ("2", "2"),
    }
    results = {}
    for signal, (prefill, decode) in values.items():
        pools = {"prefill": prefill, "decode": decode}
        for pool in leave_out.get(signal.value, ()):
            pools.pop(pool)
        results[signal] = _vector(**pools)
    return results


def test_a_query_that_answers_without_a_pool_is_named_missing_while_nan_is_only_no_value():
    readings = signals_from_results(_results(queue_total=("prefill",), gen_tps=("prefill", "decode")), T0)
    prefill, decode = readings["prefill"], readings["decode"]
    assert isinstance(prefill, PoolSignals) and isinstance(decode, PoolSignals)
    assert prefill.missing == ("gen_tps", "queue_total")
    assert decode.missing == ("gen_tps",)
    assert decode.ttft_p is None  # NaN: an idle latency, not a missing query
    full = signals_from_results(_results(), T0)
    assert full["prefill"].missing == () and full["decode"].missing == ()


def _spec():
    return parse_spec(fleet_spec(2, 2, model="m", image="i", autoscaling=SCALING, sla={"ttftMs": 500, "tpotMs": 50}))


def _step(readings):
    spec = _spec()
    nodes = [node_info(node_body(f"n-{rack}", rack, zone=None, product=None), spec.topology) for rack in "ab"]
    return plan_autoscale(
        spec=spec, pdd_name="f", status={}, nodes=nodes, readings=readings, states={}, router_views=[], now=T0
    )


def test_full_readings_scale_both_pools_up():
    result = _step(signals_from_results(_results(), T0))
    assert result.replicas["prefill"] > 2 and result.replicas["decode"] > 2
    assert result.status["autoscaler"]["metrics"]["available"] is True


def test_partial_readings_hold_and_name_the_missing_signals_per_pool():
    readings = signals_from_results(
        _results(ttft_p=("prefill",), queue_total=("prefill",), itl_p=("decode",), prompt_tps=("decode",)), T0
    )
    result = _step(readings)
    assert result.replicas == {} and result.status["drain"] is None
    assert all(d.held for d in result.decision.decisions.values())
    metrics = result.status["autoscaler"]["metrics"]
    assert metrics["available"] is False
    assert metrics["reason"] == "MetricsMissingSignals"
    assert metrics["missing"] == {"prefill": ["queue_total", "ttft_p"], "decode": ["itl_p", "prompt_tps"]}
    for name in ("prefill", "queue_total", "ttft_p", "decode", "itl_p", "prompt_tps", "holding"):
        assert name in metrics["message"], metrics["message"]

    # The reconcile turns the report into MetricsAvailable=False with the same words, and a Warning Event.
    body = {
        "metadata": {"name": "f", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": fleet_spec(2, 2, model="m", image="i", autoscaling=SCALING),
        "status": {"autoscaler": result.status["autoscaler"]},
    }
    nodes = [node_summary(node_body(f"n-{rack}", rack)) for rack in "ab"]
    plan = plan_reconcile(
        pdd=body, nodes=nodes, children=[], pods=[], pdb_api_version="policy/v1", operator_image="img", now="t"
    )
    condition = next(c for c in plan.status["conditions"] if c["type"] == "MetricsAvailable")
    assert condition["status"] == "False" and condition["reason"] == "MetricsMissingSignals"
    assert "ttft_p" in condition["message"] and "itl_p" in condition["message"]
    assert any(e.type == "Warning" and e.reason == "MetricsMissingSignals" for e in plan.events)


def test_a_pool_without_autoscaling_does_not_hold_the_report_for_missing_signals():
    wire = fleet_spec(2, 2, model="m", image="i", autoscaling=SCALING, sla={"ttftMs": 500, "tpotMs": 50})
    del wire["decode"]["autoscaling"]
    spec = parse_spec(wire)
    nodes = [node_info(node_body(f"n-{rack}", rack, zone=None, product=None), spec.topology) for rack in "ab"]
    readings = signals_from_results(_results(itl_p=("decode",)), T0)
    result = plan_autoscale(
        spec=spec, pdd_name="f", status={}, nodes=nodes, readings=readings, states={}, router_views=[], now=T0
    )
    assert result.status["autoscaler"]["metrics"]["available"] is True
    assert result.replicas.get("prefill", 2) > 2
