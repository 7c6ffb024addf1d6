"""The package layout that issue 9 asks for, checked on the source text alone.

The modules under ``src/podnet`` are parsed with :mod:`ast`; nothing is imported, so these
tests run in milliseconds and cannot be fooled by import side effects.

What counts as an import edge ``A -> B``:

* ``import podnet.x.y`` and ``from podnet.x import y`` (``y`` resolved to the module
  ``podnet.x.y`` when such a file exists, else to ``podnet.x``), relative imports included;
* at module level, inside functions (lazy imports still run), and under
  ``if TYPE_CHECKING:``.

Imports under ``if TYPE_CHECKING:`` do not execute, so they cannot make a runtime import
cycle; they are still coupling, and hiding a cycle behind ``TYPE_CHECKING`` is exactly how
the ``agent/cniserver.py`` <-> ``agent/pods.py`` cycle used to look. The issue asks that "the
import graph has no cycle", so both graphs are checked: the runtime graph (no
``TYPE_CHECKING`` edges) and the full graph (with them). A failure names the graph.

An import does not add edges to the parent packages' ``__init__`` modules: they hold no code
that imports back (``dataplane/linux/__init__`` re-exports its backend, nothing more).
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "podnet"
MAX_LINES = 400
NFTABLES_SPECIFIC = frozenset(
    f"podnet.dataplane.linux.{name}"
    for name in ("desired", "policytable", "policyscript", "nftrules", "nftables")
)
# ovs's host side (hostnet) runs linux's NAT and tunnel-guard table on the node itself
NFTABLES_HOMES = ("podnet.dataplane.linux", "podnet.dataplane.ovs.hostnet", "podnet.testing")
TESTING = "podnet.testing"


@dataclass(frozen=True)
class Import:
    """One import statement's target, as found in a module's source."""

    importer: str
    target: str
    line: int
    type_checking: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def is_type_checking_test(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "TYPE_CHECKING"
    return isinstance(node, ast.Attribute) and node.attr == "TYPE_CHECKING"


def _walk(node: ast.AST, type_checking: bool) -> Iterator[tuple[ast.AST, bool]]:
    """Every node below ``node``, with whether it sits under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and is_type_checking_test(child.test):
            for stmt in child.body:
                yield stmt, True
                yield from _walk(stmt, True)
            for stmt in child.orelse:
                yield stmt, type_checking
                yield from _walk(stmt, type_checking)
            continue
        yield child, type_checking
        yield from _walk(child, type_checking)


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, known: dict[str, Path]) -> list[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: list[Import] = []
    for node, type_checking in _walk(tree, False):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node)
            submodules = (f"{base}.{alias.name}" for alias in node.names)
            targets = [name if name in known else base for name in submodules]
        else:
            continue
        for target in targets:
            if target == "podnet" or target.startswith("podnet."):
                found.append(Import(module, target, node.lineno, type_checking))
    return found


def all_imports() -> list[Import]:
    known = all_modules()
    return [imp for name, path in known.items() for imp in imports_of(name, path, known)]


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle in the graph as ``[a, b, ..., a]``, or None (iterative DFS)."""
    state: dict[str, int] = {}  # 1 on the current path, 2 finished
    for root in sorted(edges):
        if root in state:
            continue
        path = [root]
        stack = [iter(sorted(edges.get(root, ())))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(edges.get(nxt, ()))))
    return None


def graph(imports: list[Import], with_type_checking: bool) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for imp in imports:
        if imp.importer != imp.target and (with_type_checking or not imp.type_checking):
            edges.setdefault(imp.importer, set()).add(imp.target)
    return edges


def describe_cycle(cycle: list[str], imports: list[Import]) -> str:
    lines = []
    for importer, target in itertools.pairwise(cycle):
        where = {
            (i.line, i.type_checking)
            for i in imports
            if i.importer == importer and i.target == target
        }
        marks = ", ".join(
            f"line {line}{' (TYPE_CHECKING)' if tc else ''}" for line, tc in sorted(where)
        )
        lines.append(f"  {importer} imports {target} ({marks})")
    return "\n".join(lines)


def test_module_names_resolve() -> None:
    """The walker sees the package: a broken SRC path would make every check vacuous."""
    known = all_modules()
    assert "podnet.agent.pods" in known or "podnet.agent" in known
    assert len(known) > 50
    assert any(imp.target.startswith("podnet.model") for imp in all_imports())


def test_runtime_import_graph_has_no_cycle() -> None:
    imports = all_imports()
    cycle = find_cycle(graph(imports, with_type_checking=False))
    assert cycle is None, "runtime import cycle:\n" + describe_cycle(cycle, imports)


def test_import_graph_with_type_checking_has_no_cycle() -> None:
    imports = all_imports()
    cycle = find_cycle(graph(imports, with_type_checking=True))
    assert cycle is None, (
        "import cycle (counting imports under `if TYPE_CHECKING:`):\n"
        + describe_cycle(cycle, imports)
    )


def test_nftables_specific_modules_stay_under_their_backend() -> None:
    offending = [
        f"{imp.importer} line {imp.line} imports {imp.target}"
        for imp in all_imports()
        if imp.target in NFTABLES_SPECIFIC
        and not any(_within(imp.importer, home) for home in NFTABLES_HOMES)
    ]
    assert not offending, "nftables-specific code imported outside dataplane/linux/:\n" + (
        "\n".join(offending)
    )


def test_production_code_never_imports_testing() -> None:
    offending = [
        f"{imp.importer} line {imp.line} imports {imp.target}"
        for imp in all_imports()
        if _within(imp.target, TESTING) and not _within(imp.importer, TESTING)
    ]
    assert not offending, "production code imports podnet.testing:\n" + "\n".join(offending)


def test_no_module_over_400_lines() -> None:
    too_long = {
        str(path.relative_to(SRC)): count
        for path in sorted(PACKAGE.rglob("*.py"))
        if (count := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not too_long, f"modules over {MAX_LINES} lines:\n" + "\n".join(
        f"  {path}: {count} lines" for path, count in too_long.items()
    )


def test_find_cycle_finds_a_cycle_and_accepts_a_tree() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_walker_marks_type_checking_and_lazy_imports() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import podnet.model.kinds\n"
        "if TYPE_CHECKING:\n"
        "    from podnet.agent import pods\n"
        "def f():\n"
        "    from . import sibling\n"
    )
    tree = ast.parse(source)
    seen = [
        (node.lineno, tc)
        for node, tc in _walk(tree, False)
        if isinstance(node, ast.Import | ast.ImportFrom)
    ]
    assert seen == [(1, False), (2, False), (4, True), (6, False)]


def test_imports_resolve_submodules_and_relative_names(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "from podnet.agent import pods, not_a_module\n"
        "from . import podstatus\n"
        "from ..cni.types import CniError\n"
        "import os\n"
    )
    known = {name: Path() for name in ("podnet.agent.pods", "podnet.agent.podstatus")}
    found = [(i.target, i.line) for i in imports_of("podnet.agent.mod", source, known)]
    assert found == [
        ("podnet.agent.pods", 1),
        ("podnet.agent", 1),
        ("podnet.agent.podstatus", 2),
        ("podnet.cni.types", 3),
    ]
