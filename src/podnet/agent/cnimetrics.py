"""The agent's counts of the CNI commands it served, for its ``/metrics``.

- ``podnet_cni_requests_total{command,result}``: commands answered, by CNI command
  (``ADD``, ``DEL``, ``CHECK``, ``GC``, ``STATUS``, ``VERSION``) and ``result`` (``ok``, or
  ``error`` when a CNI error object went back);
- ``podnet_cni_request_duration_seconds{command}``: the agent's time per command.

Labels come from fixed lists (a command outside them is ``other``): never a pod or
container name, so no caller can grow the series count.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from podnet.cni.validate import COMMANDS

OK, ERROR = "ok", "error"
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class CniMetrics:
    """The counter and histogram above, on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "podnet_cni_requests",
            "CNI commands answered by the agent, by command and result",
            ["command", "result"],
            registry=registry,
        )
        self.seconds = Histogram(
            "podnet_cni_request_duration_seconds",
            "The agent's time to answer a CNI command",
            ["command"],
            registry=registry,
            buckets=BUCKETS,
        )
        for command in ("ADD", "DEL"):  # the usual ones show from the start, at 0
            for result in (OK, ERROR):
                self.requests.labels(command, result)
            self.seconds.labels(command)

    def observe(self, command: str, ok: bool, seconds: float) -> None:
        """One ``command`` answered (``ok``: without a CNI error) in ``seconds``."""
        label = command if command in COMMANDS else "other"
        self.requests.labels(label, OK if ok else ERROR).inc()
        self.seconds.labels(label).observe(seconds)
