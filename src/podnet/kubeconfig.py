"""Read and write kubeconfig files, the format kubectl uses.

``load_client_config`` picks the file the way kubectl does (``--kubeconfig``, then
``$KUBECONFIG``, then ``~/.kube/config``) and reduces the current context to what the
podnet client needs: the server URL, the CA to trust, a bearer token or a client
certificate and its key, and the default namespace. ``write_kubeconfig`` writes a file
that both podnet and kubectl read.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from podnet.files import write_atomic

DEFAULT_PATH = Path("~/.kube/config")


class KubeconfigError(Exception):
    """The kubeconfig is missing, unreadable or does not describe a usable context."""


@dataclass(frozen=True)
class ClientConfig:
    """What the API client needs from a kubeconfig context."""

    server: str
    ca_data: bytes | None = None
    token: str | None = None
    insecure_skip_tls_verify: bool = False
    namespace: str | None = None
    source: Path | None = None
    # A client certificate and its key (PEM), as TLS bootstrap writes them.
    client_cert_data: bytes | None = None
    client_key_data: bytes | None = None


def resolve_path(path: str | None = None, env: Mapping[str, str] | None = None) -> Path:
    """The kubeconfig file to read: explicit path, else first existing $KUBECONFIG entry,
    else ``~/.kube/config``. Raises ``KubeconfigError`` when the chosen file is missing."""
    env = os.environ if env is None else env
    if path:
        chosen = Path(path).expanduser()
        if not chosen.is_file():
            raise KubeconfigError(f"kubeconfig {chosen} does not exist")
        return chosen
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    for entry in listed:
        candidate = Path(entry).expanduser()
        if candidate.is_file():
            return candidate
    if listed:
        raise KubeconfigError(f"none of the files in $KUBECONFIG exist: {', '.join(listed)}")
    default = DEFAULT_PATH.expanduser()
    if not default.is_file():
        raise KubeconfigError(
            f"no kubeconfig found at {default} (pass --kubeconfig or set $KUBECONFIG)"
        )
    return default


def load_client_config(path: str | None = None) -> ClientConfig:
    """Load the current context of the kubeconfig chosen by ``resolve_path``."""
    source = resolve_path(path)
    try:
        doc = yaml.safe_load(source.read_text())
    except OSError as exc:
        raise KubeconfigError(f"cannot read kubeconfig {source}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise KubeconfigError(f"kubeconfig {source} is not valid YAML: {_first_line(exc)}") from exc
    if not isinstance(doc, dict):
        raise KubeconfigError(f"kubeconfig {source} is not a YAML mapping")
    try:
        return _config_from_doc(doc, source)
    except KubeconfigError as exc:
        raise KubeconfigError(f"kubeconfig {source}: {exc}") from exc


def _config_from_doc(doc: Mapping[str, Any], source: Path) -> ClientConfig:
    context_name = doc.get("current-context")
    if not context_name:
        raise KubeconfigError("current-context is not set")
    context = _named(doc, "contexts", "context", context_name)
    cluster = _named(doc, "clusters", "cluster", context.get("cluster"))
    user = _named(doc, "users", "user", context.get("user")) if context.get("user") else {}
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("http://", "https://")):
        raise KubeconfigError(f"cluster {context.get('cluster')!r} has no http(s) server URL")
    return ClientConfig(
        server=server.rstrip("/"),
        ca_data=_ca_data(cluster, source.parent),
        token=_token(user, source.parent),
        insecure_skip_tls_verify=bool(cluster.get("insecure-skip-tls-verify", False)),
        namespace=context.get("namespace") or None,
        source=source,
        client_cert_data=_pem(user, "client-certificate", source.parent),
        client_key_data=_pem(user, "client-key", source.parent),
    )


def current_user(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The body of the current context's user (the mapping inside ``doc``, to change in
    place); ``KubeconfigError`` when the context names none."""
    context_name = doc.get("current-context")
    if not context_name:
        raise KubeconfigError("current-context is not set")
    context = _named(doc, "contexts", "context", context_name)
    if not context.get("user"):
        raise KubeconfigError(f"context {context_name!r} names no user")
    return _named(doc, "users", "user", context.get("user"))


def _named(doc: Mapping[str, Any], section: str, field: str, name: Any) -> dict[str, Any]:
    """The body of the entry called ``name`` in a list like ``clusters``."""
    entries = doc.get(section) or []
    if not isinstance(entries, list):
        raise KubeconfigError(f"{section} is not a list")
    for entry in entries:
        if isinstance(entry, dict) and entry.get("name") == name:
            body = entry.get(field) or {}
            if not isinstance(body, dict):
                raise KubeconfigError(f"{field} {name!r} is not a mapping")
            return body
    raise KubeconfigError(f"{field} {name!r} is not defined in {section}")


def _ca_data(cluster: Mapping[str, Any], base: Path) -> bytes | None:
    encoded = cluster.get("certificate-authority-data")
    if encoded:
        try:
            return base64.b64decode(str(encoded), validate=True)
        except binascii.Error as exc:
            raise KubeconfigError("certificate-authority-data is not valid base64") from exc
    ca_file = cluster.get("certificate-authority")
    if ca_file:
        return _read_relative(base, str(ca_file), "certificate-authority").encode()
    return None


def _pem(user: Mapping[str, Any], field: str, base: Path) -> bytes | None:
    """``<field>-data`` (base64 PEM) or the file ``<field>`` names, or None."""
    encoded = user.get(f"{field}-data")
    if encoded:
        try:
            return base64.b64decode(str(encoded), validate=True)
        except binascii.Error as exc:
            raise KubeconfigError(f"{field}-data is not valid base64") from exc
    named = user.get(field)
    if named:
        return _read_relative(base, str(named), field).encode()
    return None


def _token(user: Mapping[str, Any], base: Path) -> str | None:
    if user.get("token"):
        return str(user["token"])
    if user.get("tokenFile"):
        return _read_relative(base, str(user["tokenFile"]), "tokenFile").strip()
    return None


def _read_relative(base: Path, name: str, what: str) -> str:
    # kubectl resolves relative file references against the kubeconfig's own folder.
    path = (base / Path(name).expanduser()).resolve()
    try:
        return path.read_text()
    except OSError as exc:
        raise KubeconfigError(f"cannot read {what} file {path}: {exc.strerror}") from exc


def _first_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def kubeconfig_document(
    server: str, ca_pem: bytes, token: str, user: str = "admin", cluster: str = "podnet"
) -> dict[str, Any]:
    """The kubeconfig mapping for one cluster, one user and a context joining them."""
    context = f"{user}@{cluster}"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": cluster, "user": user}}],
        "current-context": context,
        "preferences": {},
    }


def write_kubeconfig(
    path: Path, server: str, ca_pem: bytes, token: str, user: str = "admin", cluster: str = "podnet"
) -> None:
    """Write a kubeconfig atomically with mode 0600 (it holds a credential)."""
    text = yaml.safe_dump(
        kubeconfig_document(server, ca_pem, token, user, cluster), sort_keys=False
    )
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text, 0o600)
