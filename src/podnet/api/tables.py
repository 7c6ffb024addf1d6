"""Server-side ``Table`` rendering (what ``kubectl get`` asks for), from the kinds' columns."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from podnet.model.kinds import Kind

TABLE_ACCEPT = "as=Table"


def wants_table(accept: str) -> bool:
    """Whether an Accept header asks for ``meta.k8s.io`` Table output."""
    return TABLE_ACCEPT in accept.replace(" ", "")


def human_age(timestamp: str | None, now: datetime | None = None) -> str:
    """kubectl-style age: 42s, 5m, 3h, 12d."""
    if not timestamp:
        return "<unknown>"
    try:
        created = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "<unknown>"
    seconds = int(((now or datetime.now(UTC)) - created).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "m" else 1):
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def _cell(value: Any) -> Any:
    if value is None or value == "":
        return "<none>"
    return value


def _age_at(kind: Kind) -> int | None:
    """Where the Age column goes: after the normal columns, before the wide-only ones
    (kubectl's order: ``NAME ... AGE SELECTOR``); None for kinds without NAME (events)."""
    if not any(c.name == "NAME" for c in kind.columns):
        return None
    return next((i for i, c in enumerate(kind.columns) if c.wide_only), len(kind.columns))


def column_definitions(kind: Kind) -> list[dict[str, Any]]:
    cols = [
        {
            "name": c.name.title() if c.name != "NAME" else "Name",
            "type": "string",
            "format": "name" if c.name == "NAME" else "",
            "description": c.name,
            "priority": 1 if c.wide_only else 0,
        }
        for c in kind.columns
    ]
    at = _age_at(kind)
    if at is not None:
        age: dict[str, Any] = {"name": "Age", "type": "string", "format": ""}
        age |= {"description": "age", "priority": 0}
        cols.insert(at, age)
    return cols


def row(kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
    cells = [_cell(c.read(obj)) for c in kind.columns]
    at = _age_at(kind)
    if at is not None:
        cells.insert(at, human_age((obj.get("metadata") or {}).get("creationTimestamp")))
    meta = dict(obj.get("metadata") or {})
    return {
        "cells": cells,
        "object": {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": meta,
        },
    }


def table(
    kind: Kind, items: list[dict[str, Any]], resource_version: str, headers: bool = True
) -> dict[str, Any]:
    """A ``meta.k8s.io/v1`` Table of ``items``."""
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": column_definitions(kind) if headers else [],
        "rows": [row(kind, obj) for obj in items],
    }
