"""Prometheus metrics of the reconcile loops, on the registry the caller serves.

- ``podnet_reconcile_applies_total{loop,result}``: passes by result (``applied``,
  ``partial``, ``rejected``, ``failed``; see ``podnet.reconcile.record``).
- ``podnet_reconcile_permanent_errors_total{loop}``: times the data plane refused a
  desired state (a permanent error: bisection follows).
- ``podnet_reconcile_left_out{loop}``: objects left out of the data plane now.
- ``podnet_reconcile_apply_seconds{loop}``: compile + apply time of a pass.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from podnet.reconcile.record import FAILED, ApplyRecord


class ReconcileMetrics:
    """The counters above; ``observe`` each pass's record."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        loop = ["loop"]
        self.applies = Counter(
            "podnet_reconcile_applies", "Reconcile passes by loop and result", [*loop, "result"],
            registry=self.registry,
        )  # fmt: skip
        self.permanent_errors = Counter(
            "podnet_reconcile_permanent_errors", "Desired states the data plane refused",
            loop, registry=self.registry,
        )  # fmt: skip
        self.left_out = Gauge(
            "podnet_reconcile_left_out", "Objects left out after a refusal", loop,
            registry=self.registry,
        )  # fmt: skip
        self.seconds = Histogram(
            "podnet_reconcile_apply_seconds", "Compile and apply time of a pass", loop,
            registry=self.registry, buckets=(0.001, 0.01, 0.1, 1, 10, 120),
        )  # fmt: skip

    def observe(self, record: ApplyRecord) -> None:
        """Count one pass."""
        self.applies.labels(record.loop, record.result).inc()
        self.seconds.labels(record.loop).observe(record.seconds)
        if record.result != FAILED:  # a transient failure says nothing of what is in
            self.left_out.labels(record.loop).set(len(record.left_out))

    def refused(self, loop: str) -> None:
        """Count one permanent error."""
        self.permanent_errors.labels(loop).inc()

    def render(self) -> bytes:
        """The text exposition format, for ``/metrics``."""
        return generate_latest(self.registry)
