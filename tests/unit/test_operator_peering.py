"""Operator replicas with Kopf peering: every replica its own priority (Kopf pauses all replicas of equal priority),
and the chart's `operator.replicas: 2` wires it."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import yaml

from pdfleet.chart import manifests as render
from pdfleet.operator.main import peering_options, peering_priority

T0 = 1_800_000_000.0


def test_every_replica_gets_its_own_priority_and_the_earliest_started_ranks_highest():
    starts = [T0, T0 + 0.001, T0 + 0.001, T0 + 5, T0 + 86_400]
    priorities = [peering_priority(start, tiebreak) for start, tiebreak in zip(starts, [7, 1, 2, 999, 0])]
    assert len(set(priorities)) == len(priorities)
    assert priorities[0] > priorities[1] and priorities[2] > priorities[3] > priorities[4]
    assert all(p < 0 for p in priorities)  # below Kopf's default (0) and --dev (666): a hand-run operator wins
    for a, b in itertools.combinations(range(1000), 2):
        assert peering_priority(T0, a) != peering_priority(T0, b)


def test_peering_options():
    assert peering_options(None, None, None, T0, 1) == {"standalone": True, "peering_name": None}
    automatic = peering_options("pdfleet", None, 10, T0, 1)
    assert automatic["standalone"] is False and automatic["peering_name"] == "pdfleet"
    assert automatic["priority"] == peering_priority(T0, 1)
    assert automatic["settings"].peering.lifetime == 10
    pinned = peering_options("pdfleet", 100, None, T0, 1)
    assert pinned["priority"] == 100 and pinned["settings"].peering.lifetime == 60  # Kopf's default


HELM = render.find_helm()


@pytest.mark.skipif(HELM is None, reason="helm not installed (bash .ci/install-control-plane.sh)")
def test_two_chart_replicas_run_peered_with_a_lifetime_and_their_pod_name_as_identity():
    rendered = render.run_helm(HELM, "template", "rel", str(render.CHART), "--set", "operator.replicas=2")
    (deployment,) = [o for o in yaml.safe_load_all(rendered) if o and o["kind"] == "Deployment"]
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--peering=pdfleet" in container["command"]
    assert "--peering-lifetime=30" in container["command"]
    assert not [arg for arg in container["command"] if arg.startswith("--peering-priority")]  # automatic, distinct
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "strategy" not in deployment["spec"]  # peered replicas may overlap in a rolling update
