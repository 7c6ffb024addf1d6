"""The test suite's own rules: nothing skips silently, no assertion reads the wall clock,
and a required tool that is missing or too old fails with what to install."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from podnet.testing import tools

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*ROOT.glob("tests/**/*.py"), *ROOT.glob("src/podnet/testing/*.py")])
CLOCKS = {"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns", "time_ns"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _parsed() -> list[tuple[Path, ast.AST]]:
    return [(path, ast.parse(path.read_text(), str(path))) for path in SOURCES]


def test_no_test_skips_or_expects_failure() -> None:
    banned = {"pytest.skip", "pytest.importorskip", "pytest.xfail"}
    banned |= {"pytest.mark.skip", "pytest.mark.skipif", "pytest.mark.xfail"}
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno} {_dotted(node)}"
        for path, tree in _parsed()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and _dotted(node) in banned
    ]
    assert found == [], "use podnet.testing.tools.require (fail, never skip)"


def test_no_assertion_reads_the_clock() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path, tree in _parsed()
        for node in ast.walk(tree)
        if isinstance(node, ast.Assert)
        for call in ast.walk(node.test)
        if isinstance(call, ast.Call)
        and _dotted(call.func).split(".")[-1] in CLOCKS
        and _dotted(call.func).startswith("time.")
    ]
    assert found == [], "timing belongs in bench/, tests assert on behaviour"


def test_the_rules_above_would_see_a_breach() -> None:
    """The two scans find what they look for (a rule that cannot fail is no rule)."""
    tree = ast.parse(
        "import pytest, time\n"
        "@pytest.mark.skipif(True, reason='x')\n"
        "def test_a():\n"
        "    started = time.monotonic()\n"
        "    assert time.monotonic() - started < 1\n"
    )
    attributes = {_dotted(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert "pytest.mark.skipif" in attributes
    asserts = [n for n in ast.walk(tree) if isinstance(n, ast.Assert)]
    calls = [_dotted(c.func) for a in asserts for c in ast.walk(a.test) if isinstance(c, ast.Call)]
    assert calls == ["time.monotonic"]


@pytest.fixture
def fake_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tool "podnet-fake" whose executable prints a version the test writes."""
    path = tmp_path / "podnet-fake"
    fake = tools.Tool("podnet-fake", "Debian package podnet-fake", str(path))
    monkeypatch.setitem(tools.TOOLS, fake.name, fake)
    return path


def test_a_missing_tool_fails_with_what_to_install(fake_tool: Path) -> None:
    reason = tools.problem("podnet-fake")
    assert reason is not None and "missing" in reason
    assert "podnet-fake" in reason and "scripts/setup.sh" in reason
    with pytest.raises(pytest.fail.Exception, match=r"scripts/setup\.sh"):
        tools.require("podnet-fake")


def test_an_old_tool_fails_and_a_new_enough_one_passes(fake_tool: Path) -> None:
    fake_tool.write_text("#!/bin/sh\necho 'podnet-fake version v1.20.3'\n")
    fake_tool.chmod(0o755)
    assert tools.version("podnet-fake") == (1, 20, 3)
    reason = tools.problem("podnet-fake", (1, 28))
    assert reason is not None and "1.20.3" in reason and ">= 1.28" in reason
    with pytest.raises(pytest.fail.Exception, match=r">= 1\.28"):
        tools.require("podnet-fake", (1, 28))
    assert tools.require("podnet-fake", (1, 20)) == str(fake_tool)


def test_a_tool_that_does_not_say_its_version_fails_a_version_check(fake_tool: Path) -> None:
    fake_tool.write_text("#!/bin/sh\nexit 1\n")
    fake_tool.chmod(0o755)
    assert tools.problem("podnet-fake") is None  # present: enough without a minimum
    reason = tools.problem("podnet-fake", (1, 0))
    assert reason is not None and "does not report its version" in reason


def test_root_is_required_not_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tools.os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.fail.Exception, match='-m "not root"'):
        tools.require_root()
