"""The router's default certificate (``podnet.router.defaultcert``): a given PEM is
checked, a missing one is made self-signed (mode 0600) and kept across restarts."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509

from podnet.router.defaultcert import (
    DefaultCertificateError,
    ensure_default_certificate,
    load_default_certificate,
    self_signed_pem,
)


def test_made_when_missing_private_and_kept_across_restarts(tmp_path: Path) -> None:
    path = ensure_default_certificate(tmp_path / "default.pem", "router.example")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = load_default_certificate(path)
    certificate = x509.load_pem_x509_certificate(text.encode())
    assert certificate.subject.rfc4514_string() == "CN=router.example"
    ensure_default_certificate(path, "router.example")
    assert path.read_text() == text


def test_an_unusable_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "default.pem"
    path.write_text("not a certificate")
    ensure_default_certificate(path, "router.example")
    assert "BEGIN CERTIFICATE" in load_default_certificate(path)


def test_a_given_file_must_hold_a_certificate_and_its_own_key(tmp_path: Path) -> None:
    one, other = self_signed_pem("a.example"), self_signed_pem("b.example")
    cert_only = one.split(b"-----BEGIN PRIVATE KEY-----")[0]
    mismatched = (
        cert_only + b"-----BEGIN PRIVATE KEY-----" + other.split(b"-----BEGIN PRIVATE KEY-----")[1]
    )
    cases = {
        "missing.pem": None,
        "cert-only.pem": cert_only,
        "mismatched.pem": mismatched,
        "garbage.pem": b"\xff\xfe",
    }
    for name, data in cases.items():
        if data is not None:
            (tmp_path / name).write_bytes(data)
        with pytest.raises(DefaultCertificateError, match=name):
            load_default_certificate(tmp_path / name)
    (tmp_path / "good.pem").write_bytes(one)
    assert load_default_certificate(tmp_path / "good.pem") == one.decode()
