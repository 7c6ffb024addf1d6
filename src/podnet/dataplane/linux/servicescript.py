"""The one ``nft -f`` transaction between two service tables, and reading the table back
from ``nft list`` output (pure; ``servicetable`` says what the table holds).

A change touches only what differs: map and set elements are added and deleted, new
chains and sets are added and stale ones deleted (a service port's chain is named by its
content, so a changed port is a new chain; see ``servicetable``). An endpoint group's
elements in the ``endpoints`` map change pick by pick; a group read back from the kernel,
whose elements are not listed, is replaced whole when its digest differs. Chains and sets never
change definition under the same name (the shared chains' comments are digests of their
rules, an affinity set's name holds its timeout), so a definition that differs replaces
the whole table, which only a new podnet version or a changed node set-up would cause.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from podnet.dataplane.linux.policyscript import removals
from podnet.dataplane.linux.servicenft import (
    ENDPOINT_DIGESTS,
    ENDPOINTS,
    TABLE_KEY,
    Chain,
    EndpointGroup,
    NftSet,
    ServiceNft,
)

_DURATION = re.compile(r"(\d+)([dhms])")
_UNIT = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def transaction(have: ServiceNft | None, want: ServiceNft) -> str:
    """The script taking the kernel's table from ``have`` (None: absent) to ``want``;
    empty when they are equal. When ``want`` was rendered right after ``have``, only the
    names its render touched are compared."""
    table = f"table {TABLE_KEY}"
    if have is not None and not (have.chains or have.sets):
        have = None  # nothing in it: as good as absent
    if not want.chains:
        return f"delete {table}\n" if have is not None else ""
    if have is None:
        return "".join(line + "\n" for line in [f"add {table}", *_changes(ServiceNft(), want)])
    touched = want.touched
    if touched is not None and have.serial == touched.since:
        return "".join(line + "\n" for line in _changes(have.only(touched), want.only(touched)))
    if _definitions_differ(have, want):
        return f"delete {table}\n" + transaction(None, want)
    return "".join(line + "\n" for line in _changes(have, want))


def _changes(old: ServiceNft, want: ServiceNft) -> list[str]:
    """The lines taking ``old`` to ``want`` (the same definition under the same name)."""
    new_chains = sorted(
        (chain for name, chain in want.chains.items() if name not in old.chains),
        key=lambda chain: chain.name,
    )
    lines = [_add_chain(chain) for chain in new_chains]
    lines += [_add_set(s) for name, s in sorted(want.sets.items()) if name not in old.sets]
    lines += _element_changes(old, want, deleting=True)
    deleted, added = _group_changes(old.groups, want.groups)
    lines += _elements_line("delete", ENDPOINTS, deleted)
    for chain in new_chains:  # one that is there is the same (name or comment)
        lines += [f"add rule {TABLE_KEY} {chain.name} {rule}" for rule in chain.rules]
    lines += _element_changes(old, want, deleting=False)
    lines += _elements_line("add", ENDPOINTS, added)
    return lines + removals(TABLE_KEY, old.chains, want.chains, old.sets, want.sets)


def _element_changes(old: ServiceNft, want: ServiceNft, *, deleting: bool) -> list[str]:
    """Deletions (before chains change: an element may name a chain about to go) or
    additions (after: an element may name a chain just made) of managed elements."""
    lines = []
    for name, wanted in sorted(want.sets.items()):
        before = old.sets.get(name)
        if wanted.elements is None:
            continue
        have = (before.elements or frozenset()) if before is not None else frozenset()
        if have is wanted.elements:
            continue  # the same render's: unchanged
        if before is None and not deleting:
            continue  # added with the set, elements included
        change = sorted(have - wanted.elements) if deleting else sorted(wanted.elements - have)
        lines += _elements_line("delete" if deleting else "add", name, change)
    return lines


def _elements_line(verb: str, name: str, elements: list[str]) -> list[str]:
    if not elements:
        return []
    return [f"{verb} element {TABLE_KEY} {name} {{ {', '.join(elements)} }}"]


def _group_changes(
    old: Mapping[str, EndpointGroup], want: Mapping[str, EndpointGroup]
) -> tuple[list[str], list[str]]:
    """The ``endpoints`` map's keys to delete and elements to add: per pick where both
    groups' targets are known, the whole group where the kernel's were read back."""
    deleted: list[str] = []
    added: list[str] = []
    for prefix, group in want.items():
        before = old.get(prefix)
        if group.same(before):
            continue
        have = _known_targets(before)
        wanted = group.targets or ()
        deleted += [
            f"{prefix} . 0x{i:08x}"
            for i, t in enumerate(have)
            if i >= len(wanted) or t != wanted[i]
        ]
        added += [
            f"{prefix} . 0x{i:08x} : {t}"
            for i, t in enumerate(wanted)
            if i >= len(have) or have[i] != t
        ]
    for prefix, before in old.items():
        if prefix not in want:
            deleted += [f"{prefix} . 0x{i:08x}" for i in range(before.count)]
    return sorted(deleted), sorted(added)


def _known_targets(group: EndpointGroup | None) -> tuple[str | None, ...]:
    """A group's targets by pick; a read-back group's picks are all unknown (None)."""
    if group is None:
        return ()
    targets = group.targets
    return targets if targets is not None else (None,) * group.count


def _add_set(s: NftSet) -> str:
    body = s.definition()
    if s.elements:
        body = body[:-1] + f"elements = {{ {', '.join(sorted(s.elements))} }}; }}"
    return f"add {s.kind} {TABLE_KEY} {s.name} {body}"


def _add_chain(chain: Chain) -> str:
    body = " ".join(
        ([chain.hook] if chain.hook else [])
        + ([f'comment "{chain.comment}";'] if chain.comment else [])
    )
    return f"add chain {TABLE_KEY} {chain.name}" + (f" {{ {body} }}" if body else "")


def _definitions_differ(have: ServiceNft, want: ServiceNft) -> bool:
    """A chain or set under the same name but another definition (hook, comment, type,
    flags, timeout): only a new podnet version, or the node's set-up changing, does it."""
    chains = any(
        name in have.chains
        and (have.chains[name].hook, have.chains[name].comment) != (chain.hook, chain.comment)
        for name, chain in want.chains.items()
    )
    return chains or any(
        name in have.sets and _definition(have.sets[name]) != _definition(s)
        for name, s in want.sets.items()
    )


def _definition(s: NftSet) -> tuple[str, str, int | None]:
    return s.type, s.flags, s.timeout


# --- reading back ---------------------------------------------------------------------------


def parse_duration(text: str) -> int:
    """``3h`` / ``1m30s`` / ``10800s`` -> seconds."""
    return sum(int(n) * _UNIT[u] for n, u in _DURATION.findall(text))


def parse_listing(text: str) -> ServiceNft | None:
    """The table from ``nft list table ip podnet_services`` (None when it is empty)."""
    sets: dict[str, NftSet] = {}
    chains: dict[str, Chain] = {}
    kind, name, attrs, rules, elements = "", "", {}, [], ""  # type: ignore[var-annotated]
    collecting = False
    for raw in text.splitlines():
        if collecting:  # an element line: normalized element by element at the end
            elements += " " + raw
            collecting = "}" not in raw
            continue
        line = " ".join(raw.split())
        if not line or line.startswith("table "):
            continue
        if line.startswith(("set ", "map ", "chain ")) and line.endswith("{"):
            kind, name, attrs, rules, elements = line.split()[0], line.split()[1], {}, [], ""
            continue
        if line == "}":
            if kind in ("set", "map"):
                sets[name] = _listed_set(name, attrs, elements)
            elif kind == "chain":
                chains[name] = Chain(
                    name, attrs.get("hook"), tuple(rules), attrs.get("comment", "")
                )
            kind = ""
            continue
        if kind in ("set", "map"):
            key, _, value = line.partition(" ")
            if key == "elements":
                elements, collecting = line, "}" not in line
            else:
                attrs[key] = value
        elif kind == "chain":
            if line.startswith("type ") and " hook " in line:
                attrs["hook"] = line
            elif line.startswith('comment "'):
                attrs["comment"] = line[len('comment "') : -1]
            else:
                rules.append(line)
    if not (sets or chains):
        return None
    digests = sets.get(ENDPOINT_DIGESTS)
    groups = dict(EndpointGroup.from_marker(m) for m in (digests.elements or ())) if digests else {}
    return ServiceNft(sets, chains, groups)


def _listed_set(name: str, attrs: dict[str, str], elements: str) -> NftSet:
    flags = attrs.get("flags", "")
    timeout = parse_duration(attrs["timeout"]) if "timeout" in attrs else None
    if "dynamic" in flags:
        return NftSet(name, attrs.get("type", ""), flags, timeout, None)
    found: frozenset[str] = frozenset()
    if elements:
        inner = elements.split("{", 1)[1].rsplit("}", 1)[0]
        found = frozenset(" ".join(e.split()) for e in inner.split(",") if e.strip())
    return NftSet(name, attrs.get("type", ""), flags, timeout, found)
