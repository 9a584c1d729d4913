"""Pure parts of the Prometheus launcher: generated config and pod -> scrape target mapping."""

from __future__ import annotations

import json
from pathlib import Path

from pdfleet.localfleet.prometheus import (
    ENGINE_JOB,
    KubernetesSD,
    ScrapeTarget,
    pod_scrape_targets,
    render_config,
    write_file_sd,
)


def _pod(name, pool="prefill", ip="10.0.0.5", scrape="true", port="8000", **extra_annotations):
    annotations = {"prometheus.io/scrape": scrape, "prometheus.io/port": port, **extra_annotations}
    labels = {"app.kubernetes.io/instance": "llama", "pdfleet.dev/pool": pool, "pdfleet.dev/rack": "rack-a"}
    return {
        "metadata": {"name": name, "namespace": "inference", "labels": labels, "annotations": annotations},
        "status": {"podIP": ip},
    }


def test_file_sd_job_scrapes_at_the_given_interval(tmp_path: Path):
    config = render_config(0.5, tmp_path / "t.json", None)
    (job,) = config["scrape_configs"]
    assert job["job_name"] == ENGINE_JOB and job["scrape_interval"] == "0.5s"
    assert job["file_sd_configs"] == [{"files": [str(tmp_path / "t.json")], "refresh_interval": "1s"}]


def test_kubernetes_sd_job_relabels_pods_by_the_convention(tmp_path: Path):
    sd = KubernetesSD("https://127.0.0.1:6443", namespaces=("inference",), bearer_token_file="/tmp/token")
    config = render_config(1, tmp_path / "t.json", sd)
    job = config["scrape_configs"][1]
    (kube,) = job["kubernetes_sd_configs"]
    assert kube["role"] == "pod" and kube["namespaces"] == {"names": ["inference"]}
    assert kube["authorization"] == {"credentials_file": "/tmp/token"}
    targets = {rule.get("target_label"): rule.get("source_labels") for rule in job["relabel_configs"]}
    assert targets["pdd"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"]
    assert targets["pool"] == ["__meta_kubernetes_pod_label_pdfleet_dev_pool"]
    assert targets["rack"] == ["__meta_kubernetes_pod_label_pdfleet_dev_rack"]
    assert targets["namespace"] == ["__meta_kubernetes_namespace"]
    assert targets["pod"] == ["__meta_kubernetes_pod_name"]


def test_pod_scrape_targets_keep_annotated_engine_pods_only():
    pods = [
        _pod("llama-prefill-rack-a-0", **{"prometheus.io/path": "/metrics"}),
        _pod("llama-decode-rack-a-0", pool="decode", ip="10.0.0.6", port="8001"),
        _pod("not-scraped", scrape="false"),
        _pod("pending", ip=None),
        _pod("router", pool=None),
    ]
    targets = pod_scrape_targets(pods)
    assert [t.address for t in targets] == ["10.0.0.5:8000", "10.0.0.6:8001"]
    assert targets[0].labels == {
        "pdd": "llama",
        "pool": "prefill",
        "rack": "rack-a",
        "namespace": "inference",
        "pod": "llama-prefill-rack-a-0",
        "__metrics_path__": "/metrics",
    }


def test_file_sd_file_is_the_documented_json(tmp_path: Path):
    path = tmp_path / "targets.json"
    write_file_sd(path, [ScrapeTarget("127.0.0.1:9000", {"pdd": "llama", "pool": "decode"})])
    assert json.loads(path.read_text()) == [
        {"targets": ["127.0.0.1:9000"], "labels": {"pdd": "llama", "pool": "decode"}}
    ]
    assert not list(tmp_path.glob("*.tmp"))
