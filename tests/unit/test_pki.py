"""The CA and serving certificate: contents, idempotence, and real TLS handshakes."""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509

from podnet.api.pki import Pki, PkiError, cert_san_names, ensure_pki

HANDSHAKE_TIMEOUT = 10.0


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return ensure_pki(tmp_path / "pki", ["10.0.0.5", "master.example", "fd00::1"])


def test_layout_and_modes(pki: Pki, tmp_path: Path) -> None:
    assert pki.directory == tmp_path / "pki"
    assert _mode(pki.directory) == 0o700
    assert _mode(pki.ca_key) == 0o600 and _mode(pki.server_key) == 0o600
    for path in (pki.ca_cert, pki.server_cert):
        assert path.exists()
    assert pki.ca_pem().startswith(b"-----BEGIN CERTIFICATE-----")


def test_ca_is_a_ten_year_ca(pki: Pki) -> None:
    ca = _cert(pki.ca_cert)
    assert ca.subject.rfc4514_string() == "CN=podnet-ca"
    assert ca.issuer == ca.subject
    bc = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca
    lifetime = ca.not_valid_after_utc - ca.not_valid_before_utc
    assert 3649 <= lifetime.days <= 3651


def test_server_cert_sans_and_issuer(pki: Pki) -> None:
    ca, server = _cert(pki.ca_cert), _cert(pki.server_cert)
    server.verify_directly_issued_by(ca)
    assert cert_san_names(server) == {
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("10.0.0.5")),
        x509.IPAddress(ipaddress.ip_address("fd00::1")),
        x509.DNSName("localhost"),
        x509.DNSName("master.example"),
    }
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_rerun_reuses_everything(pki: Pki) -> None:
    before = {p: p.read_bytes() for p in (pki.ca_cert, pki.ca_key, pki.server_cert)}
    again = ensure_pki(pki.directory, ["master.example", "10.0.0.5"])  # a subset: covered
    assert again == pki
    assert {p: p.read_bytes() for p in before} == before


def test_changed_hosts_reissue_server_cert_with_same_ca(pki: Pki) -> None:
    ca_before, key_before = pki.ca_cert.read_bytes(), pki.ca_key.read_bytes()
    serial_before = _cert(pki.server_cert).serial_number
    ensure_pki(pki.directory, ["10.0.0.5", "master.example", "fd00::1", "10.0.0.6"])
    assert pki.ca_cert.read_bytes() == ca_before and pki.ca_key.read_bytes() == key_before
    server = _cert(pki.server_cert)
    assert server.serial_number != serial_before
    assert x509.IPAddress(ipaddress.ip_address("10.0.0.6")) in cert_san_names(server)
    server.verify_directly_issued_by(_cert(pki.ca_cert))


def test_mismatched_server_key_is_repaired(pki: Pki, tmp_path: Path) -> None:
    other = ensure_pki(tmp_path / "other", [])
    pki.server_key.write_bytes(other.server_key.read_bytes())
    ensure_pki(pki.directory, ["10.0.0.5"])
    _handshake_ok_sync(pki, "127.0.0.1")


def test_half_a_ca_is_an_error(pki: Pki) -> None:
    pki.ca_key.unlink()
    with pytest.raises(PkiError, match="without its pair"):
        ensure_pki(pki.directory, [])


# ----------------------------------------------------------------- handshakes


@pytest.fixture
async def tls_server(pki: Pki) -> AsyncIterator[int]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0, ssl=pki.server_ssl_context())
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def _talk(port: int, ctx: ssl.SSLContext, hostname: str) -> bytes:
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=hostname),
        HANDSHAKE_TIMEOUT,
    )
    try:
        writer.write(b"ping\n")
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), HANDSHAKE_TIMEOUT)
    finally:
        writer.close()


@pytest.mark.parametrize("hostname", ["127.0.0.1", "localhost"])
async def test_handshake_succeeds_with_our_ca(pki: Pki, tls_server: int, hostname: str) -> None:
    assert await _talk(tls_server, pki.client_ssl_context(), hostname) == b"ping\n"


async def test_handshake_fails_with_another_ca(tls_server: int, tmp_path: Path) -> None:
    stranger = ensure_pki(tmp_path / "stranger", [])
    with pytest.raises(ssl.SSLCertVerificationError):
        await _talk(tls_server, stranger.client_ssl_context(), "127.0.0.1")


async def test_handshake_fails_for_unlisted_host(pki: Pki, tls_server: int) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        await _talk(tls_server, pki.client_ssl_context(), "10.9.9.9")


def _handshake_ok_sync(pki: Pki, hostname: str) -> None:
    async def run() -> bytes:
        server = await asyncio.start_server(_echo, "127.0.0.1", 0, ssl=pki.server_ssl_context())
        try:
            port = server.sockets[0].getsockname()[1]
            return await _talk(port, pki.client_ssl_context(), hostname)
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(run()) == b"ping\n"


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        writer.write(await reader.readline())
        await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass  # the client gave up on the handshake: that is what some tests want
    finally:
        writer.close()
