"""Where a rotated client certificate goes, as one atomic write (kubelet's rotation
keeps its kubeconfig and swaps what it points at).

- the kubeconfig embeds the pair (``client-certificate-data``, ``client-key-data``, as
  ``podnet adm join node`` writes it): the kubeconfig is rewritten with the new pair,
  everything else in it kept;
- both ``client-certificate`` and ``client-key`` name one file (kubelet's
  ``kubelet-client-current.pem``): that file is rewritten with the certificate and the
  key, and the kubeconfig is left as it is;
- they name two files: two renames cannot be one step (a reader between them would see
  a certificate without its key), so the kubeconfig is rewritten with the new pair
  embedded and the two files are left alone (no longer read).

Whatever is written is 0600 and replaces the old file in one rename
(``podnet.files.write_atomic``): a reader sees the old credentials or the new ones.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from podnet.kubeconfig import KubeconfigError, current_user

CERT, KEY = "client-certificate", "client-key"


@dataclass(frozen=True)
class CredentialWrite:
    """The one file to replace, its new content, and what it means for the log."""

    path: Path
    data: bytes
    note: str


def _referenced(user: Mapping[str, Any], field: str, base: Path) -> Path | None:
    named = user.get(field)
    if not named or user.get(f"{field}-data"):
        return None
    return (base / Path(str(named)).expanduser()).resolve()


def credential_write(
    kubeconfig: Path, doc: Mapping[str, Any], cert_pem: bytes, key_pem: bytes
) -> CredentialWrite:
    """The write that makes ``kubeconfig`` (parsed: ``doc``) name ``cert_pem`` and
    ``key_pem``; ``doc`` itself is not changed. ``KubeconfigError`` when the current
    context names no user."""
    updated: dict[str, Any] = yaml.safe_load(yaml.safe_dump(dict(doc)))  # a deep copy
    user = current_user(updated)
    cert_file = _referenced(user, CERT, kubeconfig.parent)
    key_file = _referenced(user, KEY, kubeconfig.parent)
    if cert_file is not None and cert_file == key_file:
        return CredentialWrite(cert_file, cert_pem + key_pem, f"{cert_file} (certificate and key)")
    for field in (CERT, KEY):
        user.pop(field, None)
    user[f"{CERT}-data"] = base64.b64encode(cert_pem).decode("ascii")
    user[f"{KEY}-data"] = base64.b64encode(key_pem).decode("ascii")
    note = str(kubeconfig)
    if cert_file is not None or key_file is not None:
        note += " (now embedding the pair; the files it named are no longer read)"
    return CredentialWrite(kubeconfig, yaml.safe_dump(updated, sort_keys=False).encode(), note)


def read_document(kubeconfig: Path) -> dict[str, Any]:
    """The kubeconfig as a mapping (``KubeconfigError`` when it is not one)."""
    try:
        doc = yaml.safe_load(kubeconfig.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise KubeconfigError(f"cannot read kubeconfig {kubeconfig}: {exc}") from exc
    if not isinstance(doc, dict):
        raise KubeconfigError(f"kubeconfig {kubeconfig} is not a YAML mapping")
    return doc
