"""A Prometheus metric's current value in tests, through prometheus_client's public `collect()`."""

from __future__ import annotations

from prometheus_client.metrics import MetricWrapperBase


def current(metric: MetricWrapperBase) -> float:
    """The value of a counter or gauge (or one labelled child of it: `METRIC.labels(...)`)."""
    for family in metric.collect():
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                return float(sample.value)
    raise LookupError(f"{metric!r} has no sample")
