"""Observability generated from code: fleet-state metrics, Grafana dashboards, Prometheus alert rules, operator RBAC.

Each artifact the Helm chart ships (dashboards, alert rules, ClusterRole rules) is rendered from this package by
`scripts/render_manifests.py`, so the chart never holds a hand-edited copy; drift tests compare the two.
"""
