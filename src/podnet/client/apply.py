"""``apply`` support: kubectl's last-applied annotation and a three-way merge patch."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from podnet.client.paths import metadata

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
_MISSING = object()


def with_last_applied(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object with its own JSON recorded in the last-applied annotation."""
    meta = dict(metadata(obj))
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_APPLIED}
    recorded = {**obj, "metadata": {**meta, "annotations": annotations}}
    if not annotations:
        del recorded["metadata"]["annotations"]
    text = json.dumps(recorded, sort_keys=True, separators=(",", ":"))
    return {**obj, "metadata": {**meta, "annotations": {**annotations, LAST_APPLIED: text}}}


def last_applied(live: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration last applied to ``live`` ({} when it was never applied)."""
    text = (metadata(live).get("annotations") or {}).get(LAST_APPLIED)
    try:
        found = json.loads(text) if text else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def three_way_patch(
    last: Mapping[str, Any], desired: Mapping[str, Any], live: Mapping[str, Any]
) -> dict[str, Any]:
    """A JSON merge patch taking ``live`` to ``desired``.

    Fields that differ from ``desired`` are set; fields the last applied configuration had
    but ``desired`` dropped are removed; fields nobody applied (set by the server or other
    clients) are left alone. Empty when ``live`` already matches.
    """
    patch: dict[str, Any] = {}
    for key, want in desired.items():
        have = live.get(key, _MISSING)
        if isinstance(want, Mapping) and isinstance(have, Mapping):
            before = last.get(key)
            sub = three_way_patch(before if isinstance(before, Mapping) else {}, want, have)
            if sub:
                patch[key] = sub
        elif have != want and not (want is None and have is _MISSING):
            patch[key] = want
    for key in last:
        if key not in desired and key in live:
            patch[key] = None
    return patch
