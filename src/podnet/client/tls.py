"""The TLS trust of a client: what the kubeconfig says to verify the server against."""

from __future__ import annotations

import ssl

from podnet.client.errors import ClientConfigError
from podnet.kubeconfig import ClientConfig


def ssl_context(config: ClientConfig) -> ssl.SSLContext:
    """A TLS context trusting the kubeconfig's CA (the system CAs when it names none);
    with ``insecure-skip-tls-verify`` it checks neither the certificate nor the host."""
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
