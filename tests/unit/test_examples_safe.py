"""examples/ holds only manifests safe to apply to a live cluster (issue 20), each object
with a comment before it saying what it shows. A live agent routes to every Node and
HostSubnet, so a made-up one sends real traffic to a host that is not there; the
cluster's own network objects (ClusterNetwork, NetNamespace) are the master's to make.
The manifests are read by ``podnet apply``'s own loader, so each is one it accepts.
"""

from __future__ import annotations

import re
from pathlib import Path

from podnet.cli.resources import load_manifests

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
NOT_MANIFESTS = {"systemd"}  # unit files and their env examples (test_systemd_units.py)
UNSAFE_KINDS = {"Node", "HostSubnet", "ClusterNetwork", "NetNamespace"}
SEPARATOR = re.compile(r"^---[ \t]*$", re.M)


def manifest_files() -> list[Path]:
    return sorted(
        path
        for path in EXAMPLES.rglob("*")
        if path.is_file() and not NOT_MANIFESTS & set(path.relative_to(EXAMPLES).parts)
    )


def problems(path: Path) -> list[str]:
    """What makes ``path`` unfit for examples/."""
    name = path.name
    if path.suffix not in (".yaml", ".yml"):
        return [f"{name}: not a YAML manifest (JSON cannot carry the comment)"]
    found = []
    for number, document in enumerate(SEPARATOR.split(path.read_text()), 1):
        lines = [line for line in document.splitlines() if line.strip()]
        if lines and not lines[0].lstrip().startswith("#"):
            found.append(f"{name}: document {number} has no comment before it")
    for manifest in load_manifests([str(path)], None, lambda: "default"):
        if manifest.kind.kind in UNSAFE_KINDS:
            found.append(f"{name}: {manifest.kind.kind} {manifest.name} is not safe to apply")
    return found


def test_examples_hold_manifests() -> None:
    assert [p.name for p in manifest_files()], "no manifests in examples/"


def test_every_example_is_safe_and_says_what_it_shows() -> None:
    assert [problem for path in manifest_files() for problem in problems(path)] == []


def test_the_check_sees_a_fake_node_and_a_bare_object(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "# a namespace\napiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n"
        "apiVersion: v1\nkind: Node\nmetadata: {name: node-1}\n"
    )
    (tmp_path / "bad.json").write_text('{"apiVersion": "v1"}')
    assert problems(bad) == [
        "bad.yaml: document 2 has no comment before it",
        "bad.yaml: Node node-1 is not safe to apply",
    ]
    assert problems(tmp_path / "bad.json") == [
        "bad.json: not a YAML manifest (JSON cannot carry the comment)"
    ]
