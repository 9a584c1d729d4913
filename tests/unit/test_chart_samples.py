"""The sample PDDeployments in manifests/samples/ are valid specs and explain themselves."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pdfleet.api.model import parse_spec

SAMPLES = sorted((Path(__file__).resolve().parents[2] / "manifests" / "samples").glob("*.yaml"))


def test_the_real_situations_are_covered() -> None:
    names = {p.stem for p in SAMPLES}
    assert {"rag-long-prompts", "chat-long-answers", "agent-long-context", "heterogeneous-gpus", "tcp-no-rdma"} <= names


@pytest.mark.parametrize("path", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_sample_is_a_valid_commented_pddeployment(path: Path) -> None:
    text = path.read_text()
    assert text.startswith("#"), "each sample opens with a comment saying what situation it is for"
    (obj,) = [o for o in yaml.safe_load_all(text) if o]
    assert (obj["apiVersion"], obj["kind"]) == ("pdfleet.dev/v1alpha1", "PDDeployment")
    parse_spec(obj["spec"])


def _spec(stem: str):
    (path,) = [p for p in SAMPLES if p.stem == stem]
    return parse_spec(yaml.safe_load(path.read_text())["spec"])


def test_workload_shapes_are_reflected_in_pool_sizes() -> None:
    rag, chat = _spec("rag-long-prompts"), _spec("chat-long-answers")
    assert rag.prefill.replicas > rag.decode.replicas  # prefill-heavy
    assert chat.decode.replicas > chat.prefill.replicas  # decode-heavy


def test_heterogeneous_fleet_pins_each_pool_to_its_gpu_product() -> None:
    spec = _spec("heterogeneous-gpus")
    assert "H100" in spec.prefill.gpu_product
    assert spec.decode.gpu_product and "H100" not in spec.decode.gpu_product


def test_samples_run_the_current_vllm_release() -> None:
    for path in SAMPLES:
        engine = yaml.safe_load(path.read_text())["spec"].get("engine", {})
        if engine.get("kind", "vllm") == "vllm" and "image" in engine:
            assert engine["image"] == "vllm/vllm-openai:v0.32.0", path.name


def test_no_rdma_fleet_moves_kv_over_tcp_from_host_memory() -> None:
    kv = _spec("tcp-no-rdma").kv_transfer
    assert (kv.connector, kv.buffer_device) == ("nixl", "cpu")
    assert "tcp" in kv.ucx_transports and kv.ucx_net_devices
