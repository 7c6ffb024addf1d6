"""nftables for the linux backend: one ``nft -f -`` transaction per change, read-back.

Runs ``nft`` as a subprocess, which inherits the network namespace of the calling
*thread*: call these from the backend's node-namespace worker. The parsing helpers are
pure, so the comparison of a listing with a rendered ruleset is unit-tested.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address

from podnet.dataplane.interface import DataPlaneError, DataPlaneRejected
from podnet.dataplane.linux.desired import (
    NFT_TABLE,
    POD_PORTS_SET,
    VTEP_IP_ONLY_SET,
    VTEP_MACS_SET,
    VTEP_PEERS_SET,
    PodPort,
)
from podnet.dataplane.vteppeers import VtepPeer

NFT = "nft"
TIMEOUT = 10.0
_COUNTER = re.compile(r"counter packets \d+ bytes \d+")
TRANSIENT_ERRNOS = (  # strerror texts of kernel answers that say "not now", not "never"
    "Device or resource busy",
    "No such file or directory",  # an object deleted behind our back: read it again
    "Cannot allocate memory",
    "No buffer space available",
    "Interrupted system call",
    "Resource temporarily unavailable",
)


def run(script: str, timeout: float = TIMEOUT) -> str:
    """Run ``script`` as one nft transaction (all or nothing); return nft's output."""
    try:
        done = subprocess.run(
            [NFT, "-f", "-"], input=script, capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise DataPlaneError(f"nft failed to run: {err}") from err
    if done.returncode != 0:
        raise nft_error(f"nft transaction failed: {done.stderr.strip()}")
    return done.stdout


def nft_error(message: str) -> DataPlaneError:
    """``DataPlaneRejected`` when nft refused the script itself (a parse or range error,
    or the kernel's EINVAL/ERANGE/EEXIST), else ``DataPlaneError``: a busy or missing
    object, or no memory, may pass on a retry."""
    if "Error:" in message and not any(text in message for text in TRANSIENT_ERRNOS):
        return DataPlaneRejected(message)
    return DataPlaneError(message)


def list_ruleset(timeout: float = TIMEOUT) -> str:
    """The whole ruleset of this namespace, as ``nft list ruleset`` prints it."""
    return run("list ruleset\n", timeout)


def podnet_tables(timeout: float = TIMEOUT) -> dict[str, str]:
    """podnet's node tables present in the kernel, keyed by ``"<family> podnet"``.

    Each is listed on its own: ``nft`` then reads only that table, not the (possibly large)
    policy table beside it."""
    found = {}
    for key in (f"inet {NFT_TABLE}", f"bridge {NFT_TABLE}"):
        text = list_table(key, timeout)
        if text is not None:
            found[key] = text
    return found


def list_table(key: str, timeout: float = TIMEOUT, *, terse: bool = False) -> str | None:
    """``nft list table <key>`` (``-t``: without set elements); None if it does not exist."""
    argv = [NFT, *(["-t"] if terse else []), "list", "table", *key.split()]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise DataPlaneError(f"nft failed to run: {err}") from err
    if done.returncode != 0:
        if "No such file or directory" in done.stderr:
            return None
        raise DataPlaneError(f"nft list table {key} failed: {done.stderr.strip()}")
    return done.stdout


def replace_tables(tables: Iterable[str], timeout: float = TIMEOUT) -> None:
    """Atomically replace (or create) each table in ``tables`` (full table texts)."""
    script = replace_script(tables)
    if script:
        run(script, timeout)


def replace_script(tables: Iterable[str]) -> str:
    """The nft commands that replace (or create) each table in ``tables``."""
    script = ""
    for text in tables:
        head = text.split("{", 1)[0].strip()  # "table <family> <name>"
        script += f"{head}\ndelete {head}\n{text}\n"
    return script


def delete_tables(keys: Iterable[str], timeout: float = TIMEOUT) -> None:
    """Delete the tables named ``"<family> <name>"`` (missing ones are fine)."""
    script = "".join(f"table {k}\ndelete table {k}\n" for k in keys)
    if script:
        run(script, timeout)


def update_pod_ports(
    add: Iterable[PodPort], delete: Iterable[PodPort], timeout: float = TIMEOUT
) -> None:
    """Add and delete anti-spoofing elements in one transaction."""
    run(pod_ports_script(add, delete), timeout)


def pod_ports_script(add: Iterable[PodPort], delete: Iterable[PodPort]) -> str:
    """The nft commands that delete, then add, ``pod_ports`` elements."""
    target = f"bridge {NFT_TABLE} {POD_PORTS_SET}"
    to_add, to_delete = sorted(set(add)), sorted(set(delete))
    script = elements_script(
        target, [p.element() for p in to_add], [p.element() for p in to_delete]
    )
    return script or "\n"


def elements_script(target: str, add: Iterable[str], delete: Iterable[str]) -> str:
    """The nft commands that delete, then add, elements (as text) of set ``target``
    (``"<family> <table> <set>"``); empty when there is nothing to change."""
    script = ""
    if to_delete := sorted(set(delete)):
        script += f"delete element {target} {{ {', '.join(to_delete)} }}\n"
    if to_add := sorted(set(add)):
        script += f"add element {target} {{ {', '.join(to_add)} }}\n"
    return script


# Sets whose elements change while the node runs (pods come and go, nodes join and
# leave): they are edited in place. Any other difference replaces the whole table.
DYNAMIC_SETS: dict[str, tuple[str, ...]] = {
    f"bridge {NFT_TABLE}": (POD_PORTS_SET,),
    f"inet {NFT_TABLE}": (VTEP_PEERS_SET, VTEP_MACS_SET, VTEP_IP_ONLY_SET),
}


def repair_script(want: Mapping[str, str], have: Mapping[str, str]) -> str:
    """One transaction that makes the listed tables ``have`` equal the rendered ``want``
    (both keyed by ``"<family> <name>"``): a table whose rules or fixed sets differ is
    replaced, otherwise only its dynamic set's elements are added and deleted. Empty
    when everything matches."""
    replaced, edits = [], ""
    for key, text in want.items():
        dynamic = DYNAMIC_SETS.get(key, ())
        wanted = table_view(text)
        listed = table_view(have[key]) if key in have else None
        if listed is None or _fixed(wanted, dynamic) != _fixed(listed, dynamic):
            replaced.append(text)
            continue
        for name in dynamic:
            should, has = (
                wanted.elements.get(name, frozenset()),
                listed.elements.get(name, frozenset()),
            )
            edits += elements_script(f"{key} {name}", should - has, has - should)
    return replace_script(replaced) + edits


def _fixed(
    view: TableView, dynamic: tuple[str, ...]
) -> tuple[tuple[str, ...], dict[str, frozenset[str]]]:
    """A table's rules and every set's elements but the dynamic ones'."""
    return view.lines, {k: v for k, v in view.elements.items() if k not in dynamic}


# --- pure parsing ------------------------------------------------------------------------


@dataclass(frozen=True)
class TableView:
    """A table reduced to what matters: its lines (whitespace, counters and set elements
    taken out) and each set's elements as an unordered set."""

    lines: tuple[str, ...]
    elements: Mapping[str, frozenset[str]]


def split_tables(listing: str) -> dict[str, str]:
    """Cut an ``nft list ruleset`` output into tables keyed by ``"<family> <name>"``."""
    tables: dict[str, str] = {}
    key, block = "", []
    for line in listing.splitlines():
        if line.startswith("table ") and line.rstrip().endswith("{"):
            key, block = " ".join(line.split()[1:3]), [line]
        elif key:
            block.append(line)
            if line.rstrip() == "}":
                tables[key] = "\n".join(block) + "\n"
                key = ""
    return tables


def table_view(text: str) -> TableView:
    """Normalise one table's text (rendered or listed) for comparison. The elements of a
    set the kernel fills (``flags dynamic``: a meter's entries) are left out."""
    lines: list[str] = []
    elements: dict[str, frozenset[str]] = {}
    current_set, collecting, buffer, kernel_filled = "", False, "", False
    for raw in text.splitlines():
        line = _COUNTER.sub("counter", " ".join(raw.split()))
        if collecting or line.startswith("elements = {"):
            buffer += " " + line
            collecting = "}" not in line
            if not collecting and not kernel_filled:
                elements[current_set] = _elements(buffer)
            if not collecting:
                buffer = ""
            continue
        if line.startswith("set ") or line.startswith("map "):
            current_set, kernel_filled = line.split()[1], False
        elif line.startswith("flags ") and "dynamic" in line:
            kernel_filled = True  # a meter's entries: the kernel's, not desired state
        if line:
            lines.append(line)
    return TableView(tuple(lines), elements)


def _elements(buffer: str) -> frozenset[str]:
    inner = buffer.split("{", 1)[1].rsplit("}", 1)[0]
    return frozenset(" ".join(e.split()) for e in inner.split(",") if e.strip())


def pod_ports_in(text: str) -> frozenset[str]:
    """The anti-spoofing elements (as text) in a listed bridge table."""
    return table_view(text).elements.get(POD_PORTS_SET, frozenset())


def vtep_peers_in(text: str) -> frozenset[VtepPeer]:
    """The VTEP peers a listed inet table holds: each pair of ``vtep_macs`` and each
    address of ``vtep_ip_only`` (malformed elements are left out)."""
    elements = table_view(text).elements
    peers = set()
    for element in elements.get(VTEP_MACS_SET, frozenset()):
        ip, _, mac = (part.strip() for part in element.partition(" . "))
        with contextlib.suppress(ValueError):
            peers.add(VtepPeer(IPv4Address(ip), mac.lower()))
    for element in elements.get(VTEP_IP_ONLY_SET, frozenset()):
        with contextlib.suppress(ValueError):
            peers.add(VtepPeer(IPv4Address(element)))
    return frozenset(peers)


def parse_element(element: str) -> PodPort | None:
    """A listed ``pod_ports`` element back as a ``PodPort`` (None if malformed)."""
    parts = [p.strip() for p in element.split(" . ")]
    if len(parts) != 3:
        return None
    try:
        return PodPort(parts[0].strip('"'), parts[1].lower(), IPv4Address(parts[2]))
    except ValueError:
        return None


def table_problems(key: str, want: str, have: str | None) -> list[str]:
    """Why the listed table ``have`` differs from the rendered ``want`` (empty if same)."""
    if have is None:
        return [f"nft table {key} is missing"]
    want_view, have_view = table_view(want), table_view(have)
    problems = []
    if want_view.lines != have_view.lines:
        problems.append(f"nft table {key} differs from the rendered ruleset")
    for name in sorted(set(want_view.elements) | set(have_view.elements)):
        missing = want_view.elements.get(name, frozenset()) - have_view.elements.get(
            name, frozenset()
        )
        extra = have_view.elements.get(name, frozenset()) - want_view.elements.get(
            name, frozenset()
        )
        if missing:
            problems.append(f"nft set {key} {name} lacks {sorted(missing)}")
        if extra:
            problems.append(f"nft set {key} {name} has stale {sorted(extra)}")
    return problems


# --- anti-spoofing element keys -------------------------------------------------------------

IFNAMSIZ = 16


def element_key(port: PodPort) -> bytes:
    """The kernel's key for a ``pod_ports`` element: each part of the concatenation
    padded to 4 bytes (ifname 16, ether_addr 6+2, ipv4_addr 4)."""
    mac = bytes.fromhex(port.mac.replace(":", ""))
    return port.host_ifname.encode().ljust(IFNAMSIZ, b"\0") + mac + b"\0\0" + port.ip.packed
