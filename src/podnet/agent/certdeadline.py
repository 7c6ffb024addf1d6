"""When the node agent rotates its client certificate, as pure functions (kubelet's
certificate manager rule).

The rotation point is a random moment 70-90 % of the way from the certificate's
notBefore to its notAfter, drawn once per certificate (so the nodes of a cluster,
joined together, do not all ask at once). A failed rotation is retried with
exponential backoff, capped so that several tries fit in what is left of the
certificate's life (and at ``RETRY_CAP`` once it has expired).
"""

from __future__ import annotations

import datetime as dt

from podnet.client.backoff import Backoff

JITTER_LOW = 0.7  # of the certificate's life, from notBefore
JITTER_HIGH = 0.9
RETRY_INITIAL = 1.0  # seconds before the first retry
RETRY_CAP = 300.0  # seconds between retries at most
RETRY_SHARE = 0.25  # a retry waits at most this share of the life left (but 1 s)


def jittered_fraction(draw: float) -> float:
    """The share of the life at which to rotate, for ``draw`` in [0, 1)."""
    clamped = min(max(draw, 0.0), 1.0)
    return JITTER_LOW + (JITTER_HIGH - JITTER_LOW) * clamped


def rotation_deadline(not_before: dt.datetime, not_after: dt.datetime, draw: float) -> dt.datetime:
    """The moment to rotate a certificate valid from ``not_before`` to ``not_after``."""
    return not_before + (not_after - not_before) * jittered_fraction(draw)


def seconds_until(moment: dt.datetime, now: dt.datetime) -> float:
    """Seconds from ``now`` to ``moment``; 0 once it has passed."""
    return max(0.0, (moment - now).total_seconds())


def retry_delay(attempt: int, left: float, draw: float) -> float:
    """Seconds before retry number ``attempt`` (0-based) of a failed rotation, with
    ``left`` seconds of the certificate's life remaining (<= 0: expired) and jitter from
    ``draw`` in [0, 1)."""
    cap = RETRY_CAP if left <= 0 else min(RETRY_CAP, max(RETRY_INITIAL, left * RETRY_SHARE))
    return Backoff(RETRY_INITIAL, cap, floor=0.5, rand=lambda: draw).delay(attempt)
