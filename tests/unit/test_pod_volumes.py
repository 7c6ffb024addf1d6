"""Pod volumes: what ``check_volumes`` lets into a pod's sandbox, and ``pod run --volume``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from podnet.cli.main import cli
from podnet.cluster import pods
from podnet.cluster.podcni import PodError
from podnet.cluster.podvolumes import check_volumes, parse_volume
from podnet.cluster.state import PodRecord

MNT = Path("/mnt")


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """(the cluster's state dir, a directory to share beside it)."""
    state, shared = tmp_path / "state", tmp_path / "shared"
    (state / "master").mkdir(parents=True)
    shared.mkdir()
    return state, shared


def test_parse_volume_wants_host_dir_colon_pod_dir() -> None:
    assert parse_volume("/srv/x:/mnt") == (Path("/srv/x"), MNT)
    for text in ("/srv/x", ":/mnt", "/srv/x:", "/srv/x:/mnt:ro"):
        with pytest.raises(PodError, match="expected HOST_DIR:POD_DIR"):
            parse_volume(text)


def test_a_volume_is_resolved_and_kept(dirs: tuple[Path, Path]) -> None:
    state, shared = dirs
    link = shared.parent / "link"
    link.symlink_to(shared)
    assert check_volumes([(link, MNT)], state) == ((shared, MNT),)
    assert check_volumes([], state) == ()


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("relative", "not an absolute path"),
        ("{tmp}/missing", "not an existing directory"),
        ("{tmp}/file", "not an existing directory"),
        ("{tmp}/a:b", "without ':'"),
        ("{tmp}", "would show the pod {tmp}/state, which its sandbox hides"),
        ("{tmp}/state/master", "which its sandbox hides"),
        ("/tmp", "would share the host's /tmp"),
        ("/dev", "would share the host's /dev/shm"),
        ("/", "would"),
    ],
)
def test_a_source_that_undoes_the_sandbox_is_refused(
    dirs: tuple[Path, Path], source: str, why: str
) -> None:
    state, _ = dirs
    tmp = state.parent
    (tmp / "file").write_text("x")
    (tmp / "a:b").mkdir()
    with pytest.raises(PodError, match=f"^volume .*{why.format(tmp=tmp)}"):
        check_volumes([(Path(source.format(tmp=tmp)), MNT)], state)


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("/no/such/dir", "not an existing directory"),
        ("/tmp", "overlaps /tmp, which the pod sandbox mounts"),
        ("/dev/shm", "overlaps /dev/shm"),
        ("/dev", "overlaps /dev/shm"),
        ("/proc/sys", "overlaps /proc"),
        ("{state}/master", "overlaps /tmp"),  # under /tmp here, and hidden
        ("/etc", "would cover /etc, which the pod needs"),
        (sys.prefix, "which the pod needs"),
        ("/", "overlaps"),
    ],
)
def test_a_target_the_sandbox_mounts_or_needs_is_refused(
    dirs: tuple[Path, Path], target: str, why: str
) -> None:
    state, shared = dirs
    with pytest.raises(PodError, match=f"^volume target .*{why.format(state=state)}"):
        check_volumes([(shared, Path(target.format(state=state)))], state)


def test_a_target_at_a_closed_directory_above_the_python_is_refused(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sandbox covers such a directory (``/root`` above a pyenv) with a tmpfs holding
    only the Python: it would hide a volume there."""
    from podnet.cluster import podvolumes

    state, shared = dirs
    monkeypatch.setattr(podvolumes, "closed_ancestor", lambda path: MNT)
    with pytest.raises(PodError, match="volume target /mnt: overlaps /mnt, which the pod"):
        check_volumes([(shared, MNT)], state)


def test_two_volumes_may_not_share_a_target(dirs: tuple[Path, Path]) -> None:
    state, shared = dirs
    with pytest.raises(PodError, match="overlaps another volume's, /mnt"):
        check_volumes([(shared, MNT), (shared, MNT)], state)


def fake_run_pod(seen: list[Any]) -> Any:
    def run_pod(*args: Any, volumes: Any = (), **_: Any) -> PodRecord:
        seen.append(volumes)
        return PodRecord(args[1], args[2], "node1", "pn-x-p-web", "c", ip="10.128.0.5")

    return run_pod


def test_pod_run_volume_option(dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    state, shared = dirs
    seen: list[Any] = []
    monkeypatch.setattr(pods, "run_pod", fake_run_pod(seen))
    runner = CliRunner()
    base = ["pod", "run", "--state-dir", str(state), "web"]
    done = runner.invoke(cli, [*base, "--volume", f"{shared}:/mnt"])
    assert done.exit_code == 0, done.output
    assert seen == [[(shared, MNT)]]
    for value, why in (
        ("/mnt", "expected HOST_DIR:POD_DIR"),
        (f"{state}:/mnt", "which its sandbox hides"),
        (f"{shared}:/tmp", "overlaps /tmp"),
        (f"{shared}:/nowhere", "not an existing directory"),
    ):
        refused = runner.invoke(cli, [*base, "--volume", value])
        assert refused.exit_code == 1, refused.output
        assert "--volume" in refused.output and why in refused.output, refused.output
    assert len(seen) == 1, "nothing is started for a refused volume"
