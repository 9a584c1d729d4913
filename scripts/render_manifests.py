#!/usr/bin/env python3
"""Regenerate everything the chart and manifests/ derive from code, or check that nothing drifted (`--check`).

1. charts/pdfleet/crds/: the PDDeployment CRD copied from crds/ (its single source, generated from the pydantic model),
   and Kopf's peering CRDs.
2. charts/pdfleet/dashboards/*.json, files/alert-rules.yaml, files/rbac-rules.yaml: from pdfleet.chart;
   values.schema.json and README.md: from values.yaml.
3. manifests/*.yaml: `helm template` of the chart with default values, split by kind group and prefixed with the
   Namespace, so `kubectl apply -f manifests/` installs what `helm install` with defaults installs.

Usage: scripts/render_manifests.py [--check] [--helm PATH]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from pdfleet.chart import manifests as m


def main(argv: list[str]) -> int:
    """Regenerate (default) or check (--check) the chart's generated files and manifests/."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 listing drifted files instead of writing")
    parser.add_argument("--helm", default=None, help="helm binary (default: ~/.cache/pdfleet/bin/helm or PATH)")
    args = parser.parse_args(argv)
    helm = args.helm or m.helm_binary()
    chart = (m.chart_files(), (m.CHART / "dashboards", "*.json"))
    if args.check:
        bad = m.drifted(*chart) + m.drifted(m.manifest_files(helm), (m.MANIFESTS, "*.yaml"))
        for path in bad:
            print(f"drifted: {path}", file=sys.stderr)
        if bad:
            print("run scripts/render_manifests.py to regenerate", file=sys.stderr)
        return 1 if bad else 0
    m.write(*chart)  # the manifests are rendered from the chart, so it must be current first
    m.write(m.manifest_files(helm), (m.MANIFESTS, "*.yaml"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
