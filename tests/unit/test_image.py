"""The image the chart references is the one the Dockerfile builds: same repository and tag (the package version),
entry point `pdfleet`, the user the chart's security context runs as; and docs/install.md builds it under that tag."""

from __future__ import annotations

import importlib.metadata
import re

import yaml

import pdfleet
from pdfleet.chart import manifests as chart

REPO = chart.REPO
DOCKERFILE = (REPO / "Dockerfile").read_text()


def chart_default_image() -> str:
    values = yaml.safe_load((chart.CHART / "values.yaml").read_text())
    meta = yaml.safe_load((chart.CHART / "Chart.yaml").read_text())
    return f"{values['image']['repository']}:{values['image']['tag'] or meta['appVersion']}"


def test_chart_default_image_is_the_operators_default_at_the_package_version() -> None:
    version = importlib.metadata.version("pdfleet")  # pyproject.toml's, as installed
    assert yaml.safe_load((chart.CHART / "Chart.yaml").read_text())["appVersion"] == version == pdfleet.__version__
    assert chart_default_image() == pdfleet.OPERATOR_IMAGE


def test_dockerfile_installs_the_package_with_the_pdfleet_entry_point() -> None:
    assert 'ENTRYPOINT ["pdfleet"]' in DOCKERFILE
    assert "COPY operator/ operator/" in DOCKERFILE and "pip install --no-cache-dir ." in DOCKERFILE
    security = yaml.safe_load((chart.CHART / "values.yaml").read_text())["operator"]["podSecurityContext"]
    assert f"USER {security['runAsUser']}:{security['runAsGroup']}" in DOCKERFILE
    # everything the build copies passes the .dockerignore
    allowed = {line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines() if line[:1] == "!"}
    copied = {
        src.rstrip("/") for line in re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE, re.M) for src in line.split()
    }
    assert copied <= allowed


def test_the_documented_build_tags_the_chart_default_image() -> None:
    install = (REPO / "docs" / "install.md").read_text()
    assert f"docker build -t {chart_default_image()} ." in install
    assert f"docker build -t {chart_default_image()} ." in DOCKERFILE
