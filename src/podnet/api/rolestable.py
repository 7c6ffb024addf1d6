"""The tables of what each identity may do, generated from the rule table.

``python -m podnet.api.rolestable`` prints them as markdown; docs/api-and-kubectl.md
holds that output between ``<!-- rolestable:begin -->`` and ``<!-- rolestable:end -->``,
and a unit test fails when the two differ, so the docs cannot say what ``podnet.api.roles`` does not
enforce. Three tables: verbs per identity and resource (resources whose cells are all
the same share a row), the non-resource paths per identity, and the controllers' rules
per job (``CONTROLLER_JOBS``). The object checks that follow the rules
(NodeRestriction, ControllerRestriction, a router's own status entry) are described in
the text around the tables.
"""

from __future__ import annotations

from collections.abc import Iterable

from podnet.api.roles import (
    ALL,
    AUTHORIZATION_GROUP,
    CONTROLLER_JOBS,
    REVIEWS,
    PathRule,
    RoleSet,
    Rule,
    role_path_rules,
    role_rules,
)
from podnet.model.kinds import KINDS

BEGIN = "<!-- rolestable:begin -->"
END = "<!-- rolestable:end -->"
VERB_ORDER = ("get", "head", "list", "watch", "create", "update", "patch", "delete")
NONE = "—"


def _roles(index: int) -> RoleSet:
    flags = [False] * 7
    flags[index] = True
    return (flags[0], flags[1], flags[2], flags[3], flags[4], flags[5], flags[6])


# Each identity's column: its name and the role set of an identity with that role alone.
COLUMNS = tuple(
    (name, _roles(i))
    for i, name in enumerate(
        (
            "admin",
            "node",
            "service proxy",
            "router",
            "controllers",
            "metrics reader",
            "bootstrapper",
        )
    )
)


def _resources() -> list[tuple[str, str]]:
    """Every (group, resource) the API serves, subresources included, in KINDS order."""
    out = []
    for kind in KINDS.kinds:
        out.append((kind.group, kind.plural))
        out.extend((kind.group, f"{kind.plural}/{sub}") for sub in kind.subresources)
    out.extend((AUTHORIZATION_GROUP, review) for review in sorted(REVIEWS))
    return out


def _verbs(verbs: Iterable[str]) -> str:
    return " ".join(sorted(verbs, key=lambda v: (*VERB_ORDER, v).index(v)))


def _qualifier(rule: Rule) -> str:
    where = []
    if rule.own_name:
        where.append("own name")
    for name in sorted(rule.names):
        where.append(f"`{rule.namespace}/{name}`" if rule.namespace else f"`{name}`")
    if rule.namespace and not rule.names:
        where.append(f"in `{rule.namespace}`")
    return f" ({', '.join(where)})" if where else ""


def cell(rules: Iterable[Rule], group: str, resource: str) -> str:
    """What ``rules`` grant on ``group/resource``: verbs and where, ``all`` or ``—``."""
    by_where: dict[str, set[str]] = {}  # the verbs of the rules with the same qualifier
    for rule in rules:
        if rule.wildcard:
            return "all"
        if rule.group == group and resource in rule.resources:
            by_where.setdefault(_qualifier(rule), set()).update(rule.verbs)
    return "; ".join(_verbs(verbs) + where for where, verbs in by_where.items()) or NONE


def _label(group: str, resource: str) -> str:
    return f"{resource} (`{group}`)" if group else resource


def _labels(rule: Rule) -> str:
    return ", ".join(_label(rule.group, resource) for resource in sorted(rule.resources))


def _merged(rows: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """Rows with the same cells as one, their labels joined, in first-seen order."""
    merged: dict[tuple[str, ...], list[str]] = {}
    for label, cells in rows:
        merged.setdefault(tuple(cells), []).append(label)
    return [(", ".join(labels), list(cells)) for cells, labels in merged.items()]


def _table(header: list[str], rows: list[tuple[str, list[str]]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join([label, *cells]) + " |" for label, cells in rows]
    return lines


def resource_table() -> list[str]:
    """Verbs per identity (columns) and resource (rows)."""
    rules = [role_rules(roles) for _, roles in COLUMNS]
    rows = [
        (_label(group, resource), [cell(r, group, resource) for r in rules])
        for group, resource in _resources()
    ]
    return _table(["resource", *(name for name, _ in COLUMNS)], _merged(rows))


def _path_cell(rules: Iterable[PathRule], path: str) -> str:
    granted = [rule for rule in rules if path in rule.paths or ALL in rule.paths]
    if any(ALL in rule.paths for rule in granted):
        return "all"
    return _verbs({v for rule in granted for v in rule.verbs}) or NONE


def path_table() -> list[str]:
    """Verbs per identity (columns) and non-resource path (rows)."""
    rules = [role_path_rules(roles) for _, roles in COLUMNS]
    paths = dict.fromkeys(p for r in rules for rule in r for p in rule.paths if p != ALL)
    rows = [(f"`{p}`", [_path_cell(r, p) for r in rules]) for p in paths]
    return _table(["non-resource path", *(name for name, _ in COLUMNS)], _merged(rows))


def jobs_table() -> list[str]:
    """The controllers' rules, per job."""
    rows = []
    for job, rules in CONTROLLER_JOBS.items():
        grants = [f"{_verbs(rule.verbs)} {_labels(rule)}{_qualifier(rule)}" for rule in rules]
        rows.append((job, ["; ".join(grants)]))
    return _table(["controller job", "rules"], rows)


def markdown() -> str:
    """The three tables, as they stand in docs/api-and-kubectl.md between the markers."""
    lines = [*resource_table(), "", *path_table(), "", *jobs_table()]
    return "\n".join(lines) + "\n"


def readme_section(readme: str) -> str:
    """The text between the markers in ``readme`` (ValueError when they are missing)."""
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[start:end].strip("\n") + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
