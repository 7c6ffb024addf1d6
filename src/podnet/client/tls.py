"""The TLS trust of a client: what the kubeconfig says to verify the server against."""

from __future__ import annotations

import ssl
import tempfile
from pathlib import Path

from podnet.client.errors import ClientConfigError
from podnet.files import write_atomic
from podnet.kubeconfig import ClientConfig


def ssl_context(config: ClientConfig) -> ssl.SSLContext:
    """A TLS context trusting the kubeconfig's CA (the system CAs when it names none);
    with ``insecure-skip-tls-verify`` it checks neither the certificate nor the host.
    It presents the kubeconfig's client certificate when it has one."""
    context = _trusting(config)
    if config.client_cert_data and config.client_key_data:
        _load_client_certificate(context, config.client_cert_data, config.client_key_data)
    elif config.client_cert_data or config.client_key_data:
        raise ClientConfigError("the kubeconfig has a client certificate or key without the other")
    return context


def _load_client_certificate(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """OpenSSL reads a certificate chain from files only: a private directory (0700),
    files 0600, removed at once."""
    with tempfile.TemporaryDirectory(prefix="podnet-client-") as where:
        cert_path, key_path = Path(where) / "client.crt", Path(where) / "client.key"
        write_atomic(cert_path, cert, 0o600)
        write_atomic(key_path, key, 0o600)
        try:
            context.load_cert_chain(cert_path, key_path)
        except (ssl.SSLError, ValueError) as exc:
            msg = f"the client certificate or key in the kubeconfig is invalid: {exc}"
            raise ClientConfigError(msg) from exc


def _trusting(config: ClientConfig) -> ssl.SSLContext:
    if config.insecure_skip_tls_verify:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if config.ca_data is None:
        return ssl.create_default_context()
    try:
        return ssl.create_default_context(cadata=config.ca_data.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError) as exc:
        msg = f"the certificate authority in the kubeconfig is invalid: {exc}"
        raise ClientConfigError(msg) from exc
