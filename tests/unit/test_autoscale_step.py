"""One autoscaler interval: immediate scale-up, drain-first scale-down, holding on missing metrics."""

from __future__ import annotations

from typing import Any

from pdfleet.api.model import parse_spec
from pdfleet.autoscale.signals import MetricsUnavailable, PoolSignals
from pdfleet.autoscale.step import iso, plan_autoscale
from pdfleet.testing.builders import fleet_spec, node_body
from pdfleet.topology.inventory import node_info

T0 = 1_800_000_000.0


def spec(prefill: int = 2, decode: int = 2, down_window: int = 0):
    scaling = {
        "enabled": True,
        "minReplicas": 1,
        "maxReplicas": 8,
        "scaleDownStabilizationSeconds": down_window,
        "capacityTokensPerSecond": 1000,
    }
    return parse_spec(
        fleet_spec(prefill, decode, model="m", image="i", autoscaling=scaling, sla={"ttftMs": 500, "tpotMs": 50})
    )


NODES = [
    node_info(node_body(f"n-{rack}", rack, zone=None, product=None), spec().topology) for rack in ("rack-a", "rack-b")
]


def signals(
    pool: str, ttft: float | None = None, itl: float | None = None, replicas: int = 2, tokens_per_s: float = 100.0
) -> PoolSignals:
    """A reading; `tokens_per_s` is the pool's prompt (prefill) or generated (decode) token rate."""
    return PoolSignals(
        pool=pool,
        ttft_p=ttft,
        itl_p=itl,
        queue_total=0.0,
        running_total=1.0,
        kv_usage=0.1,
        prompt_tps=tokens_per_s,
        gen_tps=tokens_per_s,
        request_rate=1.0,
        replicas_reporting=replicas,
        fetched_at=T0,
    )


def step(s, readings, status: dict[str, Any] | None = None, views=(), now: float = T0, states=None):
    return plan_autoscale(
        spec=s,
        pdd_name="f",
        status=status or {},
        nodes=NODES,
        readings=readings,
        states=states or {},
        router_views=list(views),
        now=now,
    )


def test_ttft_breach_scales_prefill_up_at_once_and_leaves_decode():
    result = step(
        spec(),
        {
            "prefill": signals("prefill", ttft=1.0, tokens_per_s=2000),
            "decode": signals("decode", itl=0.05, tokens_per_s=2000),
        },
    )
    assert result.replicas == {"prefill": 3}, "one latency breach adds at most half the reporting replicas"
    assert [e.reason for e in result.events] == ["ScaledUp"]
    assert "TTFT" in result.events[0].message and "2\u21923" in result.events[0].message
    report = result.status["autoscaler"]
    assert report["prefill"]["drivingSignal"] == "latency" and report["prefill"]["lastScaleTime"] == iso(T0)
    assert report["metrics"]["available"] is True


def test_scale_down_drains_the_newest_pods_before_lowering_replicas():
    s = spec(prefill=4)
    idle = {"prefill": signals("prefill", ttft=0.05, replicas=4), "decode": signals("decode", itl=0.05)}
    started = step(s, idle)
    assert started.replicas == {}
    drain = started.status["drain"]
    assert drain["pool"] == "prefill" and drain["targetReplicas"] < 4
    assert drain["endpoints"] and all(name.startswith("f-prefill-") for name in drain["endpoints"])

    # Routers still carry a request on a draining pod: wait.
    busy = [[{"name": drain["endpoints"][0], "draining": True, "inflight": 1}]]
    waiting = step(s, idle, status=started.status, views=busy, now=T0 + 2, states=started.states)
    assert waiting.replicas == {} and waiting.status["drain"] == drain

    # Drained everywhere: lower the replicas and clear the drain.
    quiet = [[{"name": n, "draining": True, "inflight": 0} for n in drain["endpoints"]]]
    done = step(s, idle, status=started.status, views=quiet, now=T0 + 4, states=waiting.states)
    assert done.replicas == {"prefill": drain["targetReplicas"]} and done.status["drain"] is None
    assert [e.reason for e in done.events] == ["ScaledDown"]


def test_drain_times_out_rather_than_blocking_forever():
    s = spec(prefill=4)
    idle = {"prefill": signals("prefill", ttft=0.05, replicas=4), "decode": signals("decode", itl=0.05)}
    started = step(s, idle)
    stuck = [[{"name": n, "draining": True, "inflight": 3} for n in started.status["drain"]["endpoints"]]]
    late = step(s, idle, status=started.status, views=stuck, now=T0 + 121, states=started.states)
    assert late.replicas == {"prefill": started.status["drain"]["targetReplicas"]}
    assert "timeout" in late.events[0].message


def test_load_returning_during_a_drain_cancels_it():
    s = spec(prefill=4)
    started = step(s, {"prefill": signals("prefill", ttft=0.05, replicas=4), "decode": signals("decode", itl=0.05)})
    # Demand back at what four replicas serve: the capacity signal no longer asks for fewer.
    hot = {
        "prefill": signals("prefill", ttft=0.5, replicas=4, tokens_per_s=4000),
        "decode": signals("decode", itl=0.05),
    }
    again = step(s, hot, status=started.status, views=[[]], now=T0 + 2, states=started.states)
    assert again.replicas == {} and again.status["drain"] is None
    assert [e.reason for e in again.events] == ["DrainCancelled"]


def test_missing_metrics_hold_replicas_and_say_why():
    down = {
        pool: MetricsUnavailable(pool, "unreachable", "Prometheus http://p:9090 unreachable")
        for pool in ("prefill", "decode")
    }
    result = step(spec(), down)
    assert result.replicas == {} and result.status["drain"] is None and result.events == ()
    metrics = result.status["autoscaler"]["metrics"]
    assert metrics == {
        "available": False,
        "reason": "MetricsUnreachable",
        "message": "prefill: Prometheus http://p:9090 unreachable; holding current replicas",
    }


def test_a_prefill_pool_at_zero_reports_no_metrics_problem_and_comes_back_for_prompts_it_cannot_weigh():
    s = spec(prefill=0)
    s = s.model_copy(
        update={
            "prefill": s.prefill.model_copy(
                update={"autoscaling": s.prefill.autoscaling.model_copy(update={"min_replicas": 0})}
            )
        }
    )
    readings = {
        "prefill": MetricsUnavailable("prefill", "no_samples", "no prefill replica reported engine metrics"),
        "decode": signals("decode", itl=0.02),
    }
    result = step(s, readings)
    assert result.status["autoscaler"]["metrics"]["available"] is True
    # model "m" has no timing model: the decodes' traffic cannot be weighed, so one prefill replica comes back
    assert result.replicas == {"prefill": 1}
    assert result.status["autoscaler"]["prefill"]["drivingSignal"] == "direct"


def test_default_scale_down_window_waits_before_draining():
    s = spec(prefill=4, down_window=300)
    idle = {"prefill": signals("prefill", ttft=0.05, replicas=4), "decode": signals("decode", itl=0.05)}
    first = step(s, idle)
    assert first.status["drain"] is None
    later = step(s, idle, now=T0 + 301, states=first.states)
    assert later.status["drain"] is not None


def test_an_unattainable_ttft_target_is_reported_in_status_and_adds_no_replica():
    scaling = {"enabled": True, "minReplicas": 1, "maxReplicas": 8, "capacityTokensPerSecond": 15_000}
    long_prompts = parse_spec(
        fleet_spec(2, 2, gpu_product="NVIDIA-H100-80GB-HBM3", autoscaling=scaling, sla={"ttftMs": 500, "tpotMs": 50})
    )
    prefill = PoolSignals(  # 30k-token prompts: about 1.5 s of prefill on an idle H100, so 500 ms is out of reach
        "prefill", 3.0, None, 2.0, 2.0, 0.1, 30_000.0, 200.0, 1.0, 2, T0
    )
    first = step(long_prompts, {"prefill": prefill, "decode": signals("decode", itl=0.01, tokens_per_s=200)})
    assert "prefill" not in first.replicas
    assert "no replica count meets it" in first.decision.decisions["prefill"].unattainable
    reported = first.status["autoscaler"]["prefill"]["signals"]
    assert reported["target_unattainable"] == 1.0 and reported["latency_floor_ms"] > 500
    # the Warning Event is the reconcile's, on the SLAAttainable condition's transition (test_reconcile_status.py)
    assert not [e for e in first.events if e.reason == "TargetUnattainable"]
