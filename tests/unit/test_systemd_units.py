"""The units in examples/systemd run as written (issue 20): each ``ExecStart``, with its
``EnvironmentFile`` (the example beside the unit), ``%H`` and paths filled in, goes
through the very parser of the program it names, so an option the program no longer has
(``podnet node --backend``) fails here and not in a crash-looping unit; podnet's own
commands go on through their checks to the options they would run with. Each unit also
passes ``systemd-analyze verify``.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from podnet.cli import master_cmd, node_cmd
from podnet.cli.main import CliState, cli
from podnet.cluster import relay
from podnet.store.etcd_pki import ensure_etcd_pki
from podnet.testing import tools
from podnet.testing.units import env_file, exec_start, load_unit

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "src" / "podnet" / "deploy" / "systemd"  # examples/systemd links here
INSTALL = "/opt/podnet/bin/"  # where the guide installs podnet (a virtualenv)
PODNET = INSTALL + "podnet"
PYTHON = INSTALL + "python"
ETCD = "/usr/bin/etcd"  # Debian's etcd-server


def filled(argv: list[str], root: Path) -> list[str]:
    """``argv`` with every absolute path under ``root`` (its program stays)."""
    out = [argv[0]]
    for word in argv[1:]:
        out.append(str(root) + word if word.startswith("/") else word)
    return out


def units() -> list[Path]:
    return sorted(UNITS.glob("*.service"))


def test_the_units_are_there() -> None:
    names = {path.name for path in units()}
    assert {"podnet-etcd.service", "podnet-master.service", "podnet-node.service"} <= names
    assert "podnet-api-relay.service" in names


# ---- each program's own parser --------------------------------------------------------


def run_podnet(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """``podnet ...`` through the CLI, up to the object it would run (not run)."""
    captured: list[Any] = []

    async def master_runs(service: Any, logger: str) -> None:
        captured.append(service.options)

    async def node_runs(config: Any, dataplane: str) -> None:
        captured.append(config)

    monkeypatch.setattr(master_cmd, "run_until_signalled", master_runs)
    monkeypatch.setattr(master_cmd, "log_to_stderr", lambda: None)
    monkeypatch.setattr(node_cmd, "_run", node_runs)
    result = CliRunner().invoke(cli, argv, obj=CliState())
    assert result.exit_code == 0 and captured, f"podnet {shlex.join(argv)}:\n{result.output}"
    return captured[0]


def run_relay(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    captured: list[Any] = []

    async def relays(*args: Any) -> None:
        captured.append(args)

    monkeypatch.setattr(relay, "relay", relays)
    assert argv[:2] == ["-m", "podnet.cluster.relay"], argv
    try:
        assert relay.main(argv[2:]) == 0
    except SystemExit as exc:  # argparse: an unknown or bad option
        raise AssertionError(f"python -m podnet.cluster.relay {shlex.join(argv[2:])}") from exc
    return captured[0]


def etcd_flags() -> set[str]:
    tools.require("etcd")
    done = subprocess.run(["etcd", "--help"], capture_output=True, text=True, timeout=30)
    return set(re.findall(r"^\s*(--[a-z0-9-]+)", done.stdout + done.stderr, re.M))


def make_files(root: Path) -> None:
    """What the guide puts on a host before the units start: the etcd PKI."""
    members = {f"etcd{i}": [f"10.0.0.1{i}"] for i in (1, 2, 3)}
    ensure_etcd_pki(root / "etc/podnet/etcd-pki", members)


def test_the_node_unit_runs_podnet_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    argv = exec_start(load_unit(UNITS / "podnet-node.service"))
    assert argv[0] == PODNET
    config = run_podnet(filled(argv, tmp_path)[1:], monkeypatch)
    assert config.node_ip is None  # detected at start (test_node_ip_detection.py)
    assert config.kubeconfig == tmp_path / "etc/podnet/node.kubeconfig"
    assert config.cni_bin_dir == tmp_path / "opt/cni/bin"
    assert config.cni_conf_dir == tmp_path / "etc/cni/net.d"


def test_the_master_unit_runs_podnet_master_and_advertises_its_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unit = load_unit(UNITS / "podnet-master.service")
    argv = exec_start(unit)
    assert argv[0] == PODNET
    make_files(tmp_path)
    options = run_podnet(filled(argv, tmp_path)[1:], monkeypatch)
    own = env_file(unit)["MASTER_IP"]
    assert options.listen_host == own
    # default/kubernetes gets this master as an endpoint (none without the flag)
    assert options.advertise_address == own
    assert options.etcd_tls is not None and options.etcd.count(":2379") == 3


def test_the_relay_unit_runs_the_relay(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = exec_start(load_unit(UNITS / "podnet-api-relay.service"))
    assert argv[0] == PYTHON
    netns, port, targets, host, _limits = run_relay(argv[1:], monkeypatch)
    assert (netns, port, host) == (None, 6443, "127.0.0.1")
    assert targets == [("10.0.0.21", 6443), ("10.0.0.22", 6443)]


def test_the_etcd_unit_gives_etcd_only_its_flags(tmp_path: Path) -> None:
    argv = exec_start(load_unit(UNITS / "podnet-etcd.service"))
    assert argv[0] == ETCD
    known = etcd_flags()
    assert "--client-cert-auth" in known  # the help was read
    given = [word.split("=")[0] for word in argv[1:] if word.startswith("--")]
    assert [flag for flag in given if flag not in known] == []
    make_files(tmp_path)
    for word in argv[1:]:
        if word.startswith("/etc/podnet/etcd-pki/"):
            assert (tmp_path / word.lstrip("/")).exists(), f"the PKI makes no {word}"


def test_every_podnet_unit_names_the_installed_podnet() -> None:
    programs = {path.name: exec_start(load_unit(path))[0] for path in units()}
    assert all(p.startswith(INSTALL) or p == ETCD for p in programs.values()), programs


def test_a_removed_option_fails_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old node unit's ``--backend vxlan`` is refused (a check that cannot fail is no
    check)."""
    unit = tmp_path / "old.service"
    unit.write_text("[Service]\nExecStart=/opt/podnet/bin/podnet node \\\n  --backend vxlan\n")
    argv = exec_start(load_unit(unit))
    with pytest.raises(AssertionError, match="No such option '--backend'"):
        run_podnet(argv[1:], monkeypatch)
    with pytest.raises(AssertionError, match=re.escape("podnet.cluster.relay --bogus")):
        run_relay(["-m", "podnet.cluster.relay", "--bogus", "1", "--port", "1"], monkeypatch)


# ---- systemd's own check --------------------------------------------------------------


def runnable(program: str) -> str:
    """Where this checkout has what the unit names (verify wants an executable there)."""
    if program == PODNET:
        return str(Path(sys.executable).with_name("podnet"))
    if program == PYTHON:
        return sys.executable
    return program


def test_systemd_analyze_verify_passes(tmp_path: Path) -> None:
    analyze = tools.require("systemd-analyze")
    copies = []
    for path in units():
        text = path.read_text()
        program = exec_start(load_unit(path))[0]
        copy = tmp_path / path.name
        copy.write_text(text.replace(f"ExecStart={program}", f"ExecStart={runnable(program)}"))
        copies.append(str(copy))
    done = subprocess.run([analyze, "verify", *copies], capture_output=True, text=True, timeout=120)
    ours = [line for line in done.stderr.splitlines() if "podnet" in line]
    assert done.returncode == 0 and ours == [], done.stderr


def test_verify_would_see_a_bad_unit(tmp_path: Path) -> None:
    tools.require("systemd-analyze")
    bad = tmp_path / "podnet-bad.service"
    bad.write_text("[Service]\nExecStart=/opt/podnet/bin/podnet node\nRestrt=always\n")
    done = subprocess.run(
        ["systemd-analyze", "verify", str(bad)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 or "podnet" in done.stderr


def test_the_master_unit_passes_extra_flags_split_at_spaces() -> None:
    unit = load_unit(UNITS / "podnet-master.service")
    plain = exec_start(unit, env_file(unit))
    assert plain[-2:] == ["--state-dir", "/var/lib/podnet/master"]  # empty: no word at all
    extra = {**env_file(unit), "MASTER_EXTRA_ARGS": "--cluster-signing-duration 720h"}
    assert exec_start(unit, extra)[-2:] == ["--cluster-signing-duration", "720h"]
