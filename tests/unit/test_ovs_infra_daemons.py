"""The parts of ``podnet.dataplane.ovs.daemons`` that need neither root nor OVS running:
clear errors for missing binaries and long paths, datapath detection, pidfile checks."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from podnet.dataplane.ovs import daemons
from podnet.dataplane.ovs.daemons import (
    OVSDB_SERVER,
    VSWITCHD,
    OvsDaemons,
    OvsPaths,
    OvsUnavailable,
    binary,
    datapath_type,
    running_pid,
    stop_instance,
)


def test_a_missing_binary_names_its_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(daemons.shutil, "which", lambda *_a, **_k: None)
    with pytest.raises(OvsUnavailable, match=r"ovs-vswitchd not found.*openvswitch-switch"):
        binary(VSWITCHD)
    with pytest.raises(OvsUnavailable, match=r"ovsdb-tool not found.*openvswitch-common"):
        binary("ovsdb-tool")


def test_the_kernel_datapath_when_its_module_is_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = tmp_path / "openvswitch"
    monkeypatch.setattr(daemons.shutil, "which", lambda *_a, **_k: None)  # no modprobe
    assert datapath_type(module) == "netdev"
    module.mkdir()
    assert datapath_type(module) == "system"


def test_socket_paths_must_fit_sun_path() -> None:
    OvsPaths(Path("/tmp/x/ovs")).check()
    long = Path("/tmp") / ("d" * 80)
    with pytest.raises(OvsUnavailable, match=r"longer than 107 bytes.*shorter base"):
        OvsPaths(long).check()


def test_an_unknown_datapath_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OvsUnavailable, match="unknown OVS datapath type 'dpdk'"):
        OvsDaemons(tmp_path / "ovs", datapath="dpdk")


def test_a_pidfile_is_believed_only_for_that_daemon_of_that_instance(tmp_path: Path) -> None:
    paths = OvsPaths(tmp_path)
    paths.run_dir.mkdir()
    assert running_pid(paths, VSWITCHD) is None  # no pidfile
    paths.pidfile(VSWITCHD).write_text("garbage\n")
    assert running_pid(paths, VSWITCHD) is None
    paths.pidfile(VSWITCHD).write_text(f"{os.getpid()}\n")  # alive, but python
    assert running_pid(paths, VSWITCHD) is None
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        paths.pidfile(OVSDB_SERVER).write_text(f"{sleeper.pid}\n")
        assert running_pid(paths, OVSDB_SERVER) is None
        assert stop_instance(tmp_path) == []
        assert sleeper.poll() is None, "a stranger was signalled"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_stop_instance_removes_leftovers_and_with_remove_everything(tmp_path: Path) -> None:
    base = tmp_path / "ovs"
    paths = OvsPaths(base)
    paths.run_dir.mkdir(parents=True)
    paths.db.parent.mkdir()
    paths.db.write_text("db")
    leftovers = [paths.db_socket, paths.pidfile(VSWITCHD), paths.unixctl(OVSDB_SERVER)]
    leftovers += [paths.mgmt("br0"), paths.run_dir / "br0.snoop"]
    for path in leftovers:
        path.write_text("")
    assert stop_instance(base) == []
    assert os.listdir(paths.run_dir) == [] and paths.db.exists()
    stop_instance(base, remove=True)
    assert not base.exists()
