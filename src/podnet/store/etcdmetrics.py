"""Prometheus metrics of the etcd calls of one ``EtcdStore`` (the master's).

- ``podnet_etcd_request_duration_seconds{operation}``: each call's time, answered or
  failed; ``operation`` is the gRPC method (``Range``, ``Txn``, ``Compact``) or ``watch``
  (opening a watch stream): a fixed set, whatever the keys asked.
- ``podnet_etcd_request_errors_total{operation,code}``: failed calls by gRPC status code
  name (``UNAVAILABLE``, ``DEADLINE_EXCEEDED`` ...: gRPC's fixed list); a call refused at
  once because the health probe finds etcd down counts as ``UNAVAILABLE``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

OPERATIONS = ("Range", "Txn", "Compact", "watch")
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class EtcdMetrics:
    """The histogram and the error counter above, on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.seconds = Histogram(
            "podnet_etcd_request_duration_seconds",
            "Time of the master's etcd requests, by operation",
            ["operation"],
            registry=registry,
            buckets=BUCKETS,
        )
        self.errors = Counter(
            "podnet_etcd_request_errors",
            "Failed etcd requests, by operation and gRPC status code",
            ["operation", "code"],
            registry=registry,
        )
        for operation in OPERATIONS:  # every series shows from the start, at 0
            self.seconds.labels(operation)

    def observe(self, operation: str, seconds: float) -> None:
        """One call of ``operation`` (one of ``OPERATIONS``) took ``seconds``."""
        self.seconds.labels(operation).observe(seconds)

    def failed(self, operation: str, code: str) -> None:
        """One call of ``operation`` failed with gRPC status ``code`` (its name)."""
        self.errors.labels(operation, code).inc()
