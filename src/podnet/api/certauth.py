"""Who is calling, by a verified client certificate (kube's x509 authenticator).

The TLS layer (``podnet.api.pki.Pki.server_ssl_context``) asks for an optional client
certificate and verifies it against the cluster CA (chain, validity, and OpenSSL's
``sslclient`` purpose); a certificate the CA did not sign fails the handshake. What gets
here is the verified leaf, and this module turns it into a ``User``:

- the certificate must carry the clientAuth extended key usage (a serving certificate,
  or one without the extension, is refused: 401);
- the subject's one common name is the user name, its organizations the groups;
- no certificate may claim ``system:masters``: the admin authenticates by token only,
  and the CSR signer never signs that group (so a certificate with it is refused even
  when the CA signed it);
- a certificate past its notAfter is refused on every request (401), not only at the
  handshake: a connection kept alive does not outlive its certificate (kube's x509
  authenticator verifies the chain at each request too), so a node that rotates
  moves to its new certificate and an old one stops working when it expires;
- a certificate ``revoked`` names is refused (the default revokes nothing; the master's is
  ``podnet.api.certrevocation``: every certificate of a user issued before a moment; the
  moment of issue is ``podnet.api.pki.issued_at``'s).
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Callable

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from podnet.api.identity import MASTERS_GROUP, User
from podnet.api.pki import issued_at
from podnet.model.csr import CsrError, subject_of
from podnet.model.errors import unauthorized

# Whether the certificate of this user, serial number and moment of issue is revoked
# (``podnet.api.certrevocation``).
Revoked = Callable[[User, int, datetime.datetime], bool]
# Groups a client certificate may never carry.
REFUSED_GROUPS = frozenset({MASTERS_GROUP})


def nothing_revoked(user: User, serial: int, issued: datetime.datetime) -> bool:
    """The default revocation list: empty."""
    return False


@functools.lru_cache(maxsize=4096)
def _parse(der: bytes) -> tuple[User, int, datetime.datetime, datetime.datetime] | str:
    """The user, serial, moment of issue and notAfter of a certificate, or why it may
    not authenticate."""
    try:
        cert = x509.load_der_x509_certificate(der)
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return "the client certificate has no extended key usage (clientAuth is required)"
    except ValueError as exc:
        return f"the client certificate cannot be read: {exc}"
    if ExtendedKeyUsageOID.CLIENT_AUTH not in usage:
        return "the client certificate is not for client authentication (no clientAuth)"
    try:
        subject = subject_of(cert)
    except CsrError as exc:
        return f"the client certificate's subject: {exc}"
    if not subject.common_name:
        return "the client certificate has an empty common name"
    refused = REFUSED_GROUPS.intersection(subject.organizations)
    if refused:
        return f"a client certificate may not claim the group {sorted(refused)[0]}"
    user = User(subject.common_name, subject.organizations)
    return user, cert.serial_number, issued_at(cert), cert.not_valid_after_utc


def user_of_certificate(
    der: bytes, revoked: Revoked = nothing_revoked, now: datetime.datetime | None = None
) -> User:
    """The user a verified client certificate (DER) names; 401 ``ApiError`` otherwise
    (``now``: the time to check its expiry against, default the clock's)."""
    parsed = _parse(der)
    if isinstance(parsed, str):
        raise unauthorized(f"Unauthorized: {parsed}")
    user, serial, issued, not_after = parsed
    if (now or datetime.datetime.now(datetime.UTC)) > not_after:
        raise unauthorized("Unauthorized: the client certificate has expired")
    if revoked(user, serial, issued):
        raise unauthorized("Unauthorized: the client certificate is revoked")
    return user
