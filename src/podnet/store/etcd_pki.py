"""TLS material for etcd: two private CAs, member certificates and client certificates.

Layout of the directory (0700; every key 0600, certificates 0644)::

    ca.crt, ca.key                  client CA: signs members' serving certs and clients
    peer-ca.crt, peer-ca.key        peer CA: signs member-to-member certificates only
    member-<name>.crt/.key          serving certificate of member <name> (client port)
    peer-<name>.crt/.key            peer certificate of member <name> (peer port)
    client-<user>.crt/.key          a client identity, e.g. ``client-podnet-master``

etcd runs with ``--client-cert-auth`` and ``--peer-client-cert-auth``, trusting ``ca.crt``
on the client port and ``peer-ca.crt`` on the peer port. A separate peer CA means a client
certificate cannot join the cluster as a member, and a peer certificate cannot talk to
the client port. Every call is safe to re-run: a certificate that is signed by its CA,
matches its key and names the wanted hosts is kept.

For real hosts, make the files on one machine and copy each member its own::

    python -m podnet.store.etcd_pki --dir /etc/podnet/etcd-pki \\
        --member etcd1=10.0.0.11 --member etcd2=10.0.0.12 --member etcd3=10.0.0.13 \\
        --client podnet-master
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from podnet.api.pki import (
    PkiError,
    _same_key,
    _signed_by,
    cert_san_names,
    issue_leaf,
    key_pem,
    load_or_create_ca,
    san_names,
)
from podnet.files import write_atomic

MASTER_CLIENT = "podnet-master"
# Every member's serving certificate names this too, and clients check it, so one gRPC
# channel can fail over between members at different addresses (podnet.store.etcd_client).
MEMBER_TLS_NAME = "etcd.podnet.internal"
SERVER_AND_CLIENT = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)
CLIENT_ONLY = (ExtendedKeyUsageOID.CLIENT_AUTH,)


@dataclass(frozen=True)
class CertPair:
    """A certificate and its key on disk."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class EtcdTls:
    """What a client needs to reach etcd: the CA to trust and its own cert and key."""

    ca: Path
    cert: Path
    key: Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(CA PEM, private key PEM, certificate PEM), as gRPC wants them."""
        return self.ca.read_bytes(), self.key.read_bytes(), self.cert.read_bytes()


@dataclass(frozen=True)
class EtcdPki:
    """The file layout under ``directory`` (nothing is read or created)."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def peer_ca(self) -> Path:
        return self.directory / "peer-ca.crt"

    def member(self, name: str) -> CertPair:
        return self._pair(f"member-{name}")

    def peer(self, name: str) -> CertPair:
        return self._pair(f"peer-{name}")

    def client(self, user: str = MASTER_CLIENT) -> CertPair:
        return self._pair(f"client-{user}")

    def client_tls(self, user: str = MASTER_CLIENT) -> EtcdTls:
        """The TLS settings of client ``user``."""
        pair = self.client(user)
        return EtcdTls(self.ca, pair.cert, pair.key)

    def _pair(self, stem: str) -> CertPair:
        return CertPair(self.directory / f"{stem}.crt", self.directory / f"{stem}.key")


def _check_name(name: str) -> None:
    if not name or not all(c.isalnum() or c in "-_." for c in name) or name.startswith("."):
        raise PkiError(f"bad etcd member or client name {name!r}: use letters, digits, -_.")


def _reusable(pair: CertPair, ca_cert: x509.Certificate, names: set[x509.GeneralName]) -> bool:
    if not (pair.cert.exists() and pair.key.exists()):
        return False
    try:
        cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
        key = serialization.load_pem_private_key(pair.key.read_bytes(), password=None)
    except ValueError:
        return False
    return (
        _signed_by(cert, ca_cert)
        and _same_key(cert, key)  # type: ignore[arg-type]
        and names <= cert_san_names(cert)
    )


def _ensure_leaf(
    pair: CertPair, ca: tuple[x509.Certificate, object], cn: str, hosts: Sequence[str] | None
) -> None:
    ca_cert, ca_key = ca
    names: set[x509.GeneralName] = set(san_names(hosts)) if hosts is not None else set()
    if _reusable(pair, ca_cert, names):
        return
    purposes = SERVER_AND_CLIENT if hosts is not None else CLIENT_ONLY
    cert, key = issue_leaf(ca_cert, ca_key, cn, names, purposes)  # type: ignore[arg-type]
    write_atomic(pair.key, key_pem(key), 0o600)
    write_atomic(pair.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def ensure_etcd_pki(
    directory: Path,
    members: Mapping[str, Sequence[str]],
    clients: Sequence[str] = (MASTER_CLIENT,),
) -> EtcdPki:
    """Create or reuse both CAs, a serving and a peer certificate for every member
    (``members``: name -> extra hosts; 127.0.0.1 and localhost are always named), and a
    client certificate for every name in ``clients``."""
    pki = EtcdPki(Path(directory))
    pki.directory.mkdir(parents=True, exist_ok=True)
    os.chmod(pki.directory, 0o700)
    client_ca = load_or_create_ca(pki.ca, pki.directory / "ca.key", "podnet-etcd-ca")
    peer_ca = load_or_create_ca(pki.peer_ca, pki.directory / "peer-ca.key", "podnet-etcd-peer-ca")
    for name, hosts in members.items():
        _check_name(name)
        _ensure_leaf(pki.member(name), client_ca, f"etcd-{name}", [*hosts, MEMBER_TLS_NAME])
        _ensure_leaf(pki.peer(name), peer_ca, f"etcd-peer-{name}", list(hosts))
    for user in clients:
        _check_name(user)
        _ensure_leaf(pki.client(user), client_ca, user, None)
    return pki


def main(argv: list[str] | None = None) -> int:
    """``python -m podnet.store.etcd_pki``: make the files for a real etcd cluster."""
    parser = argparse.ArgumentParser(prog="python -m podnet.store.etcd_pki")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--member", action="append", default=[], help="NAME=HOST[,HOST...]")
    parser.add_argument("--client", action="append", default=[], help="client name (CN)")
    args = parser.parse_args(argv)
    members: dict[str, list[str]] = {}
    for spec in args.member:
        name, _, hosts = spec.partition("=")
        members[name] = [h for h in hosts.split(",") if h]
    try:
        ensure_etcd_pki(args.dir, members, args.client or [MASTER_CLIENT])
    except PkiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"etcd PKI in {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
