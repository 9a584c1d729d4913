"""The autoscaler's own Prometheus metrics (exported by its Kopf daemon in pdfleet.autoscale.handlers).

Defined apart from the handlers so dashboards, alerts and the fleet-state collector can name them without registering
any Kopf handler.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

LABELS = ("namespace", "pdd", "pool")
DESIRED = Gauge("pdfleet_autoscaler_desired_replicas", "Replicas the autoscaler wants", LABELS)
CURRENT = Gauge("pdfleet_autoscaler_current_replicas", "spec replicas when the autoscaler decided", LABELS)
SIGNAL = Gauge("pdfleet_autoscaler_signal_value", "Signals the autoscaler observed", LABELS + ("signal",))
DECISIONS = Counter("pdfleet_autoscaler_decisions_total", "Autoscaler decisions", LABELS + ("direction", "signal"))
METRICS_AVAILABLE = Gauge(
    "pdfleet_autoscaler_metrics_available", "1 when every autoscaled pool had fresh metrics", ("namespace", "pdd")
)
TARGET_UNATTAINABLE = Gauge(
    "pdfleet_autoscaler_target_unattainable",
    "1 while the pool's latency target is below its requests' own floor (no replica count meets it)",
    LABELS,
)
DRAINING = Gauge("pdfleet_autoscaler_drain_in_progress", "1 while a pool drains before a scale-down", LABELS)
