"""One reconcile loop for the agent: change -> coalesce -> compile -> apply -> resync.

Every part of the node agent that keeps a piece of the data plane equal to the cluster
(remote nodes, isolation and NetworkPolicy; next the service proxy, the DNS server and
the router) is a ``Target`` driven by a ``ReconcileLoop``:

```python
class Target(Protocol[D]):       # D: the desired state, a plain value
    name: str                                    # "policy", "remote-nodes"
    def take(self) -> Callable[[], D]            # queued changes -> the compile step
    async def apply(self, desired: D) -> None    # one all-or-nothing data plane call
    def keys(self, desired: D) -> Sequence[str]  # the objects bisection may leave out
    def without(self, desired: D, left_out: frozenset[str]) -> D
    def describe(self, desired: D) -> str        # "12 pods, 3 policies"
    async def after_apply(self, desired: D, record: ApplyRecord) -> None

pacing = Pacing(resync_period, coalesce=0.015, compile_in_thread=True)
loop = ReconcileLoop(target, pacing, inputs=("pods", "policies"),
                     metrics=..., report=note.record)
loop.listed("pods")   # an input's first listing arrived
loop.changed()        # any later change
loop.poke()           # apply again now (after the node was set up again)
await loop.run()      # for ever; loop.synced, loop.last, loop.left_out say how it went
```

What a pass does:

1. Nothing until every named input has delivered its first listing (a partial view
   would, for example, isolate pods from peers not seen yet).
2. After a change it waits ``Pacing.coalesce`` for the rest of a burst, then ``take``s
   the changes and compiles, in a worker thread when ``compile_in_thread``.
3. ``apply`` runs under ``apply_timeout``. A transient error (``DataPlaneError``, the
   timeout) is logged and retried with the one ``podnet.client.Backoff``.
4. A permanent error (``DataPlaneRejected``: the kernel or nft refused the input) is
   logged at error level and counted (``ReconcileMetrics``), and felix-style bisection
   (``bisect.find_rejected``) re-applies the desired state with halves of its keyed
   objects left out until it finds the one (or few) the data plane refuses. The rest is
   applied; the left-out objects are named in the log, the record and the metrics. A
   refusal no object explains is recorded as ``rejected`` and tried again at the next
   change or resync, not in a tight loop.
5. Every ``resync_period`` without a change the same desired state is applied again, so
   the backend repairs drift (a state already cut by bisection is re-applied as cut).
6. Each pass ends in an ``ApplyRecord`` (what, when, how long, result, error, left-out
   objects) handed to ``report``: the agent's ``StatusNote`` publishes them, rate
   limited, as the node's annotation ``podnet.io/reconcile``.

Modules: ``loop`` (the loop and ``Target``), ``bisect`` (pure search over keys),
``record`` (``ApplyRecord``, results, ``Clock``, fake in tests), ``note`` (the status
note), ``metrics`` (Prometheus counters).
"""

from podnet.reconcile.loop import Pacing, ReconcileLoop, Target
from podnet.reconcile.metrics import ReconcileMetrics
from podnet.reconcile.note import StatusNote
from podnet.reconcile.record import (
    APPLIED,
    FAILED,
    PARTIAL,
    REJECTED,
    ApplyRecord,
    Clock,
)

__all__ = [
    "APPLIED",
    "FAILED",
    "PARTIAL",
    "REJECTED",
    "ApplyRecord",
    "Clock",
    "Pacing",
    "ReconcileLoop",
    "ReconcileMetrics",
    "StatusNote",
    "Target",
]
