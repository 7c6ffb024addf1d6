"""The one ``nft -f`` transaction between two rendered policy tables, and reading a table
back from ``nft -t list table`` (pure; see ``policytable`` for what the table holds)."""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from typing import Protocol

from podnet.dataplane.linux.policyvalues import TABLE_KEY, Chain, NftSet, PolicyTable

# --- the transaction -----------------------------------------------------------------------


def transaction(have: PolicyTable | None, want: PolicyTable) -> str:
    """The one ``nft -f`` script taking the table from ``have`` (None: absent) to ``want``.

    Order matters inside it: chains a map or rule will name exist first, chains are
    refilled before the sets they stop using are deleted, and chains go last."""
    table = f"table {TABLE_KEY}"
    if want.empty:
        return f"delete {table}\n" if have is not None else ""
    if have is not None and _hooks_differ(have, want):
        return f"delete {table}\n" + transaction(None, want)
    old = have or PolicyTable()
    lines = [f"add {table}"] if have is None else []
    new_chains = [c for c in want.chains.values() if c.name not in old.chains]
    lines += [_add_chain(c) for c in new_chains]
    lines += [
        f"add {s.kind} {TABLE_KEY} {s.name} {s.body()}"
        for name, s in sorted(want.sets.items())
        if name not in old.sets
    ]
    for chain in want.chains.values():
        before = old.chains.get(chain.name)
        if before is None or before.rules != chain.rules:
            if before is not None:
                lines.append(f"flush chain {TABLE_KEY} {chain.name}")
            lines += [f"add rule {TABLE_KEY} {chain.name} {rule}" for rule in chain.rules]
    lines += removals(TABLE_KEY, old.chains, want.chains, old.sets, want.sets)
    return "".join(line + "\n" for line in lines)


class _Kinded(Protocol):
    @property
    def kind(self) -> str: ...


def removals(
    table: str,
    old_chains: Iterable[str],
    new_chains: Container[str],
    old_sets: Mapping[str, _Kinded],
    new_sets: Container[str],
) -> list[str]:
    """The end of a transaction: stale chains emptied, then stale sets and maps deleted
    (no rule names them any more), then the chains (nothing jumps to them any more)."""
    stale = sorted(name for name in old_chains if name not in new_chains)
    lines = [f"flush chain {table} {name}" for name in stale]
    lines += [
        f"delete {s.kind} {table} {name}"
        for name, s in sorted(old_sets.items())
        if name not in new_sets
    ]
    return lines + [f"delete chain {table} {name}" for name in stale]


def _add_chain(chain: Chain) -> str:
    if chain.hook is None:
        return f"add chain {TABLE_KEY} {chain.name}"
    return f"add chain {TABLE_KEY} {chain.name} {{ {chain.hook} }}"


def _hooks_differ(have: PolicyTable, want: PolicyTable) -> bool:
    return any(
        name in have.chains and have.chains[name].hook != chain.hook
        for name, chain in want.chains.items()
    )


# --- reading back --------------------------------------------------------------------------


def parse_listing(text: str) -> PolicyTable | None:
    """The table from ``nft [-t] list table inet podnet_policy`` output (None if empty).

    Sets come back with their names, types and flags; their elements are not needed, since
    a name is a digest of them."""
    sets: dict[str, NftSet] = {}
    chains: dict[str, Chain] = {}
    kind, name, attrs, rules = "", "", {}, []  # type: ignore[var-annotated]
    collecting_elements = False
    for raw in text.splitlines():
        line = " ".join(raw.split())
        if collecting_elements:
            collecting_elements = "}" not in line
            continue
        if not line or line.startswith("table "):
            continue
        if line.startswith(("set ", "map ", "chain ")) and line.endswith("{"):
            kind, name, attrs, rules = line.split()[0], line.split()[1], {}, []
            continue
        if line == "}":
            if kind in ("set", "map"):
                sets[name] = NftSet(
                    name, attrs.get("type", ""), "interval" in attrs.get("flags", "")
                )
            elif kind == "chain":
                chains[name] = Chain(name, attrs.get("hook"), tuple(rules))
            kind = ""
            continue
        if kind in ("set", "map"):
            key, _, value = line.partition(" ")
            if key == "elements":
                collecting_elements = "}" not in line
            else:
                attrs[key] = value
        elif kind == "chain":
            if line.startswith("type ") and " hook " in line:
                attrs["hook"] = line
            else:
                rules.append(line)
    return PolicyTable(sets, chains) if (sets or chains) else None
