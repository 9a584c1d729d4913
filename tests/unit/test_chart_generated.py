"""Everything the chart and manifests/ derive from code is current: CRD copy, dashboards, alert rules, RBAC rules."""

from __future__ import annotations

import pytest

from pdfleet.chart import manifests as render

REPO = render.REPO


HELM = render.find_helm()
needs_helm = pytest.mark.skipif(HELM is None, reason="helm not installed (bash .ci/install-control-plane.sh)")


def test_chart_crd_is_the_generated_crd_byte_for_byte() -> None:
    copy = REPO / "charts" / "pdfleet" / "crds" / "pdfleet.dev_pddeployments.yaml"
    assert copy.read_text() == (REPO / "crds" / "pdfleet.dev_pddeployments.yaml").read_text(), (
        "run scripts/render_manifests.py"
    )


def test_chart_files_generated_from_code_have_not_drifted() -> None:
    assert render.drifted(render.chart_files(), (render.CHART / "dashboards", "*.json")) == [], (
        "run scripts/render_manifests.py"
    )


@needs_helm
def test_manifests_are_the_chart_defaults_rendered() -> None:
    assert render.drifted(render.manifest_files(HELM), (render.MANIFESTS, "*.yaml")) == [], (
        "run scripts/render_manifests.py"
    )


def test_manifests_crd_is_the_generated_crd() -> None:
    source = REPO / "crds" / "pdfleet.dev_pddeployments.yaml"
    assert (REPO / "manifests" / "01-crd.yaml").read_text() == source.read_text()
