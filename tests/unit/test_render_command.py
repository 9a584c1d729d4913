"""`pdfleet render`: the objects the operator's own plan renders for a spec file, or the operator's error, one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pdfleet.api.model import parse_spec
from pdfleet.cli.main import main
from pdfleet.reconcile.cli import default_nodes, load_documents

SAMPLES = sorted((Path(__file__).resolve().parents[2] / "manifests" / "samples").glob("*.yaml"))
FLEET_KINDS = ["Service", "PodDisruptionBudget", "Deployment", "ConfigMap"]


def render(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict], str]:
    code = main(["render", *argv])
    captured = capsys.readouterr()
    return code, [o for o in yaml.safe_load_all(captured.out) if o], captured.err


@pytest.mark.parametrize("path", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_every_sample_renders_the_fleet_the_operator_creates(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, objects, err = render(["-f", str(path)], capsys)
    assert code == 0, err
    assert "no --nodes" in err  # the default inventory is said out loud
    (pdd,) = load_documents(path)
    spec = parse_spec(pdd["spec"])
    kinds = {o["kind"] for o in objects}
    assert {"StatefulSet", *FLEET_KINDS} <= kinds
    for pool in ("prefill", "decode"):
        cells = [
            o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["labels"]["pdfleet.dev/pool"] == pool
        ]
        assert sum(c["spec"]["replicas"] for c in cells) == getattr(spec, pool).replicas
    assert all(o["metadata"]["namespace"] == pdd["metadata"]["namespace"] for o in objects)


def test_nodes_file_as_a_kubectl_list_places_cells_per_rack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": f"n-{rack}", "labels": {"topology.pdfleet.dev/rack": rack}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]},
        }
        for rack in ("r1", "r2")
    ]
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}))
    basic = next(p for p in SAMPLES if p.stem == "basic")
    code, objects, err = render(["-f", str(basic), "--nodes", str(tmp_path / "nodes.yaml")], capsys)
    assert code == 0 and "no --nodes" not in err
    racks = sorted(o["metadata"]["labels"]["pdfleet.dev/rack"] for o in objects if o["kind"] == "StatefulSet")
    assert racks == ["r1", "r1", "r2", "r2"]


def _write_pdd(tmp_path: Path, spec_change: dict) -> Path:
    basic = next(p for p in SAMPLES if p.stem == "basic")
    (pdd,) = load_documents(basic)
    pdd["spec"]["prefill"].update(spec_change)
    path = tmp_path / "pdd.yaml"
    path.write_text(yaml.safe_dump(pdd))
    return path


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"replica": 2}, "InvalidSpec: spec.prefill.replica: unknown field"),
        ({"gpusPerReplica": -1}, "InvalidSpec: spec.prefill.gpusPerReplica"),
    ],
    ids=["unknown-field", "invalid-value"],
)
def test_an_invalid_spec_is_the_operators_message_on_one_line(
    change: dict, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, objects, err = render(["-f", str(_write_pdd(tmp_path, change))], capsys)
    assert code == 1 and objects == []
    (line,) = [x for x in err.splitlines() if "no --nodes" not in x]
    assert line.startswith("pdfleet render: error: ") and expected in line


def test_no_matching_nodes_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nodes.yaml").write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-only", "labels": {}}})
    )
    path = _write_pdd(tmp_path, {})
    code, objects, err = render(["-f", str(path), "--nodes", str(tmp_path / "nodes.yaml")], capsys)
    assert code == 1 and objects == []
    (line,) = err.splitlines()
    assert "NoMatchingNodes" in line


def test_other_kinds_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    code, _, err = render(["-f", str(tmp_path / "cm.yaml")], capsys)
    assert code == 1 and "is not a pdfleet.dev/v1alpha1 PDDeployment" in err


def test_default_nodes_fit_each_pools_gpu_product_and_autoscaling_maximum() -> None:
    spec = parse_spec(
        {
            "model": {"name": "m"},
            "prefill": {"replicas": 1, "gpuProduct": "H100", "autoscaling": {"enabled": True, "maxReplicas": 6}},
            "decode": {"replicas": 2, "gpusPerReplica": 2, "nodeSelector": {"pool": "decode"}},
        }
    )
    prefill, decode = default_nodes(spec)
    assert prefill["metadata"]["labels"]["nvidia.com/gpu.product"] == "H100"
    assert prefill["status"]["allocatable"]["nvidia.com/gpu"] == "6"
    assert decode["metadata"]["labels"]["pool"] == "decode"
    assert decode["status"]["allocatable"]["nvidia.com/gpu"] == "4"
