"""``podnet router``'s bad input: each ends as one ``error:`` line before anything runs
(no HAProxy, no run dir touched), and a run dir holding files the router did not make
is refused rather than taken over (its stop would remove them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from podnet.api.pki import ensure_pki
from podnet.cli.main import cli
from podnet.kubeconfig import write_kubeconfig
from podnet.router.process import foreign_files, prepare_run_dir
from podnet.testing import tools
from podnet.testing.routerns import weak_leaf


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    pki = ensure_pki(tmp_path / "pki", ["127.0.0.1"])
    path = tmp_path / "router.kubeconfig"
    write_kubeconfig(path, "https://127.0.0.1:1", pki.ca_pem(), "token")
    return path


def run(kubeconfig: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--kubeconfig", str(kubeconfig), "router", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bind", "not-an-ip"], "'not-an-ip' is not an IP address"),
        (["--http-port", "8443", "--https-port", "8443"], "must differ"),
        (["--http-port", "0"], "0 is not in the range"),
        (["--metrics", "1936"], "metrics address '1936' is not HOST:PORT"),
        (["--reload-interval", "-1"], "-1.0 is not in the range"),
    ],
)
def test_bad_flags_are_one_error_line(
    kubeconfig: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    run_dir = tmp_path / "run"
    code, output = run(kubeconfig, "--run-dir", str(run_dir), *args)
    assert code != 0 and message in output
    assert output.startswith("error:") and len(output.strip().splitlines()) == 1
    assert not run_dir.exists()


def test_a_bad_default_certificate_is_refused_before_anything_runs(
    kubeconfig: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "default.pem"
    bad.write_text("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
    run_dir = tmp_path / "run"
    code, output = run(kubeconfig, "--run-dir", str(run_dir), "--default-certificate", str(bad))
    assert code == 1 and output.startswith("error:") and str(bad) in output
    assert not run_dir.exists()


def test_a_run_dir_too_long_for_haproxys_sockets_is_refused(
    kubeconfig: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / ("x" * 120)
    code, output = run(kubeconfig, "--run-dir", str(run_dir))
    assert code == 1 and "too long for a unix socket path" in output


def test_a_run_dir_with_files_of_others_is_refused_and_left_alone(
    kubeconfig: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "etc"
    run_dir.mkdir()
    (run_dir / "passwd").write_text("keep me")
    code, output = run(kubeconfig, "--run-dir", str(run_dir))
    assert code == 1 and "holds files the router did not make: passwd" in output
    assert (run_dir / "passwd").read_text() == "keep me"


def test_run_dir_is_made_private_and_locked(tmp_path: Path) -> None:
    ours = tmp_path / "ours"
    ours.mkdir()
    for name in ("gen-3", "current", "haproxy.pid", "master.sock", "default.pem", "rejected"):
        (ours / name).touch()
    assert foreign_files(ours) == []
    (ours / "gen-x").touch()
    assert foreign_files(ours) == ["gen-x"]
    assert foreign_files(tmp_path / "missing") == []
    run_dir = tmp_path / "run"
    fd = prepare_run_dir(run_dir)
    try:
        assert run_dir.stat().st_mode & 0o777 == 0o700
        with pytest.raises(ValueError, match="another podnet router runs with --run-dir"):
            prepare_run_dir(run_dir)
    finally:
        os.close(fd)
    os.close(prepare_run_dir(run_dir))  # free again once the holder is gone


def test_a_default_certificate_haproxy_refuses_fails_the_start(
    kubeconfig: Path, tmp_path: Path
) -> None:
    """Parseable, its own key, but a 1024-bit RSA key that HAProxy (OpenSSL's default
    security level) will not load: the start fails with HAProxy's words, nothing left."""
    tools.require("haproxy")
    certificate, key = weak_leaf("router.example")
    weak = tmp_path / "weak.pem"
    weak.write_text(certificate + key)
    run_dir = tmp_path / "run"
    code, output = run(kubeconfig, "--run-dir", str(run_dir), "--default-certificate", str(weak))
    assert code == 1 and output.startswith("error: HAProxy refuses the router's base config")
    assert "weak.pem" in output
    assert not run_dir.exists()
