"""How the CLI prints objects: kubectl-style tables, names, JSON, YAML and describe views.

Everything but ``Printer`` (which writes ``get``/``get -w`` output as it arrives) is a
pure function of the objects and the current time, passed in, so it is tested without a
server. Output is plain text: no colour, no terminal codes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import click
import yaml

from podnet.model.kinds import NODE, POD, Column, Kind

NONE = "<none>"
GAP = "   "
_TIMESTAMP_COLUMNS = {"LAST SEEN"}


def human_duration(seconds: float) -> str:
    """An age the way kubectl prints it: ``5s``, ``3m20s``, ``2h``, ``4d``, ``2y30d``."""
    secs = int(seconds)
    if secs < -1:
        return "<invalid>"
    if secs < 120:
        return f"{max(secs, 0)}s"
    minutes, hours, days = secs // 60, secs // 3600, secs // 86400
    if minutes < 10:
        return _pair(minutes, "m", secs % 60, "s")
    if hours < 3:
        return f"{minutes}m"
    if hours < 8:
        return _pair(hours, "h", minutes % 60, "m")
    if hours < 48:
        return f"{hours}h"
    if days < 8:
        return _pair(days, "d", hours % 24, "h")
    if days < 365 * 2:
        return f"{days}d"
    if days < 365 * 8:
        return _pair(days // 365, "y", days % 365, "d")
    return f"{days // 365}y"


def _pair(big: int, big_unit: str, small: int, small_unit: str) -> str:
    return f"{big}{big_unit}" if small == 0 else f"{big}{big_unit}{small}{small_unit}"


def parse_timestamp(value: Any) -> datetime | None:
    """An RFC 3339 timestamp as an aware datetime, or None when absent or malformed."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def age(timestamp: Any, now: datetime) -> str:
    """Time since ``timestamp`` as kubectl shows it, ``<unknown>`` when there is none."""
    created = parse_timestamp(timestamp)
    if created is None:
        return "<unknown>"
    return human_duration((now - created).total_seconds())


def cell(value: Any) -> str:
    """One table cell: ``<none>`` for empty values, lists comma-joined, one line."""
    if value is None or value == "" or value == []:
        return NONE
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(cell(v) for v in value)
    return " ".join(str(value).split()) or NONE


def format_table(headers: Sequence[str], rows: Iterable[Sequence[str]], indent: str = "") -> str:
    """Left-aligned columns three spaces apart, no trailing spaces."""
    stream = TableStream(list(headers))
    return "\n".join(indent + line for line in stream.start([list(r) for r in rows]))


@dataclass
class TableStream:
    """A table whose rows arrive over time (``get -w``): widths come from the first batch."""

    headers: list[str]
    widths: list[int] = field(default_factory=list)

    def start(self, rows: list[list[str]]) -> list[str]:
        """The header line and the first rows, aligned together."""
        self.widths = [len(h) for h in self.headers]
        for row in rows:
            self.widths = [max(w, len(c)) for w, c in zip(self.widths, row, strict=False)]
        return [self.line(self.headers), *(self.line(r) for r in rows)]

    def line(self, cells: Sequence[str]) -> str:
        """One row padded to the known widths."""
        padded = [c.ljust(w) for c, w in zip(cells, self.widths, strict=False)]
        return GAP.join(padded).rstrip()


def _has_age(kind: Kind) -> bool:
    # Events lead with LAST SEEN instead of a NAME and an AGE.
    return any(c.name == "NAME" for c in kind.columns)


def _columns(kind: Kind, wide: bool) -> tuple[list[Column], list[Column]]:
    normal = [c for c in kind.columns if not c.wide_only]
    extra = [c for c in kind.columns if c.wide_only] if wide else []
    return normal, extra


def table_headers(kind: Kind, wide: bool = False, all_namespaces: bool = False) -> list[str]:
    """Column headers: [NAMESPACE], the kind's columns, AGE, then wide-only columns."""
    normal, extra = _columns(kind, wide)
    head = ["NAMESPACE"] if all_namespaces and kind.namespaced else []
    ages = ["AGE"] if _has_age(kind) else []
    return head + [c.name.upper() for c in normal] + ages + [c.name.upper() for c in extra]


def table_row(
    kind: Kind,
    obj: Mapping[str, Any],
    now: datetime,
    wide: bool = False,
    all_namespaces: bool = False,
) -> list[str]:
    """The cells of one object, matching ``table_headers``."""
    normal, extra = _columns(kind, wide)
    meta = obj.get("metadata") or {}
    head = [cell(meta.get("namespace"))] if all_namespaces and kind.namespaced else []
    ages = [age(meta.get("creationTimestamp"), now)] if _has_age(kind) else []
    return head + _cells(normal, obj, now) + ages + _cells(extra, obj, now)


def _cells(columns: Sequence[Column], obj: Mapping[str, Any], now: datetime) -> list[str]:
    out = []
    for column in columns:
        value = column.read(obj)
        if column.name in _TIMESTAMP_COLUMNS and parse_timestamp(value):
            value = age(value, now)
        out.append(cell(value))
    return out


def render_table(
    kind: Kind,
    objects: Sequence[Mapping[str, Any]],
    now: datetime | None = None,
    wide: bool = False,
    all_namespaces: bool = False,
) -> str:
    """The whole ``get`` table for a list of objects."""
    now = now or datetime.now(UTC)
    rows = [table_row(kind, o, now, wide, all_namespaces) for o in objects]
    return format_table(table_headers(kind, wide, all_namespaces), rows)


def object_name(kind: Kind, obj: Mapping[str, Any]) -> str:
    """``-o name``: ``hostsubnet.network.openshift.io/node1``, ``pod/web`` (as kubectl)."""
    resource = f"{kind.singular}.{kind.group}" if kind.group else kind.singular
    return f"{resource}/{(obj.get('metadata') or {}).get('name', '')}"


def with_type(kind: Kind, obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object with apiVersion and kind filled in (list items may lack them)."""
    return {"apiVersion": kind.api_version, "kind": kind.kind, **obj}


def as_list(kind: Kind, objects: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A kubectl-style ``List`` of typed objects for -o json/yaml."""
    items = [with_type(kind, o) for o in objects]
    return {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {}}


def to_json(obj: Any) -> str:
    """Indented JSON, as kubectl -o json."""
    return json.dumps(obj, indent=4)


def to_yaml(obj: Any) -> str:
    """Block-style YAML keeping the object's key order."""
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False).rstrip("\n")


@dataclass
class Printer:
    """Prints a first listing, then watch events, in one output format."""

    kind: Kind
    fmt: str | None
    all_namespaces: bool = False
    stream: TableStream | None = None
    count: int = 0

    def initial(self, objects: list[dict[str, Any]], single: bool) -> None:
        """The objects found by get (one object printed bare for json/yaml)."""
        if self.fmt in ("json", "yaml"):
            doc = with_type(self.kind, objects[0]) if single else as_list(self.kind, objects)
            self._emit(doc)
        elif self.fmt == "name":
            for obj in objects:
                click.echo(object_name(self.kind, obj))
        elif objects:
            self._table(objects)

    def event(self, obj: dict[str, Any]) -> None:
        """One object from a watch event."""
        if self.fmt in ("json", "yaml"):
            self._emit(with_type(self.kind, obj))
        elif self.fmt == "name":
            click.echo(object_name(self.kind, obj))
        elif self.stream is None:
            self._table([obj])
        else:
            click.echo(self.stream.line(self._row(obj)))

    def _table(self, objects: list[dict[str, Any]]) -> None:
        self.stream = TableStream(table_headers(self.kind, self.fmt == "wide", self.all_namespaces))
        for line in self.stream.start([self._row(o) for o in objects]):
            click.echo(line)

    def _row(self, obj: Mapping[str, Any]) -> list[str]:
        now = datetime.now(UTC)
        return table_row(self.kind, obj, now, self.fmt == "wide", self.all_namespaces)

    def _emit(self, doc: Any) -> None:
        if self.fmt == "json":
            click.echo(to_json(doc))
        else:
            click.echo(("---\n" if self.count else "") + to_yaml(doc))
        self.count += 1


# ---- describe ---------------------------------------------------------------------------

_SKIP_TOP = {"apiVersion", "kind", "metadata"}


def field_label(key: str) -> str:
    """``hostIP`` -> ``Host IP``, ``egressCIDRs`` -> ``Egress CIDRs``."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", key)
    return spaced[:1].upper() + spaced[1:]


def describe(kind: Kind, obj: Mapping[str, Any], now: datetime | None = None) -> str:
    """A readable view: identity, labels, annotations, then the body as YAML-ish text."""
    now = now or datetime.now(UTC)
    meta = obj.get("metadata") or {}
    created = meta.get("creationTimestamp")
    header: list[tuple[str, list[str]]] = [("Name", [cell(meta.get("name"))])]
    if kind.namespaced:
        header.append(("Namespace", [cell(meta.get("namespace"))]))
    header.append(("Labels", _pairs(meta.get("labels"), "=")))
    header.append(("Annotations", _pairs(meta.get("annotations"), ": ")))
    when = f"{created} ({age(created, now)} ago)" if parse_timestamp(created) else "<unknown>"
    header.append(("CreationTimestamp", [when]))
    width = max(len(label) for label, _ in header) + 3
    lines = []
    for label, values in header:
        lines.append(f"{label + ':':<{width}}{values[0]}".rstrip())
        lines.extend(" " * width + v for v in values[1:])
    body = {k: v for k, v in obj.items() if k not in _SKIP_TOP}
    lines.extend(_describe_body(kind, body, width))
    return "\n".join(lines)


def _pairs(mapping: Any, sep: str) -> list[str]:
    if not isinstance(mapping, Mapping) or not mapping:
        return [NONE]
    return [f"{k}{sep}{v}" for k, v in sorted(mapping.items())]


# The condition columns kubectl describe shows: all of them for a Node, two for a Pod.
_CONDITION_KEYS = {
    NODE.plural: ["type", "status", "lastHeartbeatTime", "lastTransitionTime", "reason", "message"],
    POD.plural: ["type", "status"],
}


def _describe_body(kind: Kind, body: dict[str, Any], width: int) -> list[str]:
    conditions: list[Any] = []
    keys = _CONDITION_KEYS.get(kind.plural) if kind in (NODE, POD) else None
    if keys and isinstance(body.get("status"), Mapping):
        status = dict(body["status"])
        conditions = status.pop("conditions", None) or []
        body = {**body, "status": status}
    lines = render_mapping(body, 0, width)
    if keys and (kind is NODE or conditions):  # kubectl: a Pod's only when it has some
        lines.append("Conditions:")
        lines.extend(_conditions(conditions, keys))
    return lines


def _conditions(conditions: Sequence[Any], keys: list[str]) -> list[str]:
    if not conditions:
        return [f"  {NONE}"]
    headers = [k[:1].upper() + k[1:] for k in keys]
    rows = [[cell(c.get(k)) for k in keys] for c in conditions if isinstance(c, Mapping)]
    rules = ["-" * len(h) for h in headers]
    return format_table(headers, [rules, *rows], indent="  ").split("\n")


def render_mapping(mapping: Mapping[str, Any], indent: int, min_width: int = 0) -> list[str]:
    """Nested fields as ``Label:  value`` lines, children indented by two spaces."""
    if not mapping:
        return []
    pad = " " * indent
    scalars = [field_label(str(k)) for k, v in mapping.items() if not _is_block(v)]
    width = max([min_width, *(len(label) + 3 for label in scalars)])
    lines = []
    for key, value in mapping.items():
        label = field_label(str(key)) + ":"
        if _is_block(value):
            lines.append(pad + label)
            lines.extend(_render_block(value, indent + 2))
        else:
            lines.append(f"{pad}{label:<{width}}{_scalar(value)}".rstrip())
    return lines


def _is_block(value: Any) -> bool:
    if isinstance(value, Mapping):
        return bool(value)
    return isinstance(value, list) and any(isinstance(v, Mapping | list) for v in value)


def _render_block(value: Any, indent: int) -> list[str]:
    if isinstance(value, Mapping):
        return render_mapping(value, indent)
    lines = []
    for item in value:
        item_lines = (
            render_mapping(item, indent + 2)
            if isinstance(item, Mapping)
            else [" " * (indent + 2) + _scalar(item)]
        )
        if item_lines:
            first = item_lines[0]
            item_lines[0] = first[:indent] + "- " + first[indent + 2 :]
        lines.extend(item_lines)
    return lines


def _scalar(value: Any) -> str:
    if isinstance(value, Mapping | list) and not value:
        return NONE
    return cell(value)
