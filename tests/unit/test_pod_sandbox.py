"""The pod sandbox's pure parts: what is hidden, what is exposed, the wrapper command."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from podnet.cluster import sandbox
from podnet.cluster.sandbox import Sandbox, closed_ancestor, hidden_paths, outermost


def test_hidden_paths_keep_existing_outermost_directories(tmp_path: Path) -> None:
    state = tmp_path / "cluster"
    (state / "master").mkdir(parents=True)
    (tmp_path / "file").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(state)
    found = hidden_paths([state / "master", link, tmp_path / "missing", tmp_path / "file"])
    assert state in found, "the symlink is resolved"
    assert state / "master" not in found, "inside a hidden directory already"
    assert tmp_path / "missing" not in found and tmp_path / "file" not in found
    assert all(p.is_dir() for p in found) and Path("/") not in found


def test_outermost_drops_nested_paths() -> None:
    paths = [Path("/a/b"), Path("/a"), Path("/c/d"), Path("/ab")]
    assert outermost(paths) == [Path("/a"), Path("/ab"), Path("/c/d")]


def test_closed_ancestor_is_the_topmost_directory_others_cannot_enter() -> None:
    top = Path(tempfile.mkdtemp(prefix="pn-sandbox-", dir="/tmp"))  # pytest's tmp is closed
    try:
        top.chmod(0o755)
        inner = top / "home" / "lib" / "python"
        inner.mkdir(parents=True)
        (top / "home").chmod(0o700)
        (top / "home" / "lib").chmod(0o700)
        assert closed_ancestor(inner) == top / "home"
        (top / "home").chmod(0o711)  # enterable, not listable
        assert closed_ancestor(inner) == top / "home" / "lib"
        (top / "home" / "lib").chmod(0o755)
        assert closed_ancestor(inner) is None
    finally:
        shutil.rmtree(top)


def test_wrap_runs_the_command_last_and_untouched() -> None:
    box = Sandbox((Path("/var/lib/podnet"),), 1_000_000_001, 1_000_000_001, (Path("/opt/py"),))
    argv = box.wrap("/run/netns/pod", ["sh", "-c", "echo -- x", "--"], report_fd=7)
    assert argv[:4] == [sys.executable, "-m", "podnet.cluster.sandbox", "run"]
    assert argv[argv.index("--netns") + 1] == "/run/netns/pod"
    assert argv[argv.index("--uid") + 1] == argv[argv.index("--gid") + 1] == "1000000001"
    assert argv[argv.index("--report-fd") + 1] == "7"
    assert argv[-5:] == ["--", "sh", "-c", "echo -- x", "--"]
    assert argv[argv.index("--hide") : argv.index("--hide") + 2] == ["--hide", "/var/lib/podnet"]
    assert "--expose" in argv and "/opt/py" in argv


def test_exec_argv_names_the_pods_process_and_runs_the_command_last() -> None:
    argv = sandbox.exec_argv(4242, 99, ["sh", "-c", "id", "--"])
    assert argv[:4] == [sys.executable, "-m", "podnet.cluster.sandbox", "exec"]
    assert argv[4:8] == ["--pid", "4242", "--start", "99"]
    assert argv[-5:] == ["--", "sh", "-c", "id", "--"]


def test_a_bad_volume_is_refused_before_anything_is_set_up() -> None:
    argv = Sandbox((), volumes=((Path("rel"), Path("/mnt")),)).wrap("/run/netns/x", ["true"])
    assert sandbox.main(argv[3:]) == 126  # no namespace entered, nothing mounted


def test_pods_get_none_of_the_callers_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/var/lib/podnet/cluster/master/admin.kubeconfig")
    monkeypatch.setenv("PODNET_TOKEN", "secret")
    env = sandbox.pod_environment()
    assert "KUBECONFIG" not in env and "PODNET_TOKEN" not in env
    assert env["HOME"] == "/" and "/usr/bin" in env["PATH"]


def test_interpreter_paths_hold_this_python_and_podnet() -> None:
    paths = sandbox.interpreter_paths()
    assert any(Path(os.path.realpath(sys.executable)).is_relative_to(p) for p in paths)
    import podnet

    assert any(Path(podnet.__file__).resolve().is_relative_to(p) for p in paths)
