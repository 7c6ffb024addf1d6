"""What ``podnet adm diagnose`` removes from a support bundle before it writes a byte.

Two layers, applied to every member of the bundle:

* patterns, which need no knowledge of the cluster: PEM blocks of any ``PRIVATE KEY``
  (also a block cut short by a size cap or a log tail), kubeconfig and JSON fields that
  hold credentials (``token``, ``client-key-data``, ``password``...), ``Bearer`` headers,
  ``tokens.csv`` lines (the token column) and bootstrap tokens (``abcdef.0123456789abcdef``,
  printed by ``podnet adm token create``: their secret is nowhere on disk, only its hash
  in etcd);
* the cluster's own secrets, found on disk by :func:`known_secrets` (every token in every
  tokens file, also a ``tokens.csv.imported`` a master left after importing it into
  etcd, token file and kubeconfig; every line of every PEM private key, and the
  base64 of the whole key as a kubeconfig embeds it): each occurrence anywhere is replaced.

The second layer catches what the patterns cannot know about (a token logged by mistake, a
key's body lines without their ``BEGIN`` line); the first catches secrets that are not on
this disk (a real host's other masters' tokens).
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

MARK = "REDACTED"
MIN_SECRET = 8  # shorter values are too common to replace everywhere
READ_LIMIT = 1 << 20  # a secrets file is small; bigger files are data, not credentials

PEM_PRIVATE = re.compile(
    r"-----BEGIN ([A-Z0-9 ]*PRIVATE KEY)-----.*?(?:-----END \1-----|\Z)", re.DOTALL
)
# A field that holds a credential, in YAML (``token: x``) or JSON (``"token": "x"``).
SECRET_FIELD = (
    r"token|id-token|refresh-token|access-token|client-key-data|client-key|password|"
    r"secret|private-key|privateKey|keyData|key-data"
)
YAML_FIELD = re.compile(rf"(?im)^(\s*(?:-\s+)?[\"']?(?:{SECRET_FIELD})[\"']?\s*:[ \t]*)(\S.*)$")
JSON_FIELD = re.compile(rf"(?i)(\"(?:{SECRET_FIELD})\"\s*:\s*)\"(?:[^\"\\]|\\.)*\"")
BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]+")
# tokens.csv: token,user,uid[,groups]; the token is the first column, no spaces.
TOKENS_CSV_LINE = re.compile(r"(?m)^[A-Za-z0-9._~+/=-]{16,}(?=,[^,\n]+,[^,\n]*(?:,|$))")
# podnet adm token create's id.secret (kubeadm's format), wherever it shows
BOOTSTRAP_TOKEN = re.compile(r"\b[a-z0-9]{6}\.[a-z0-9]{16}\b")
SECRET_KEY_NAME = re.compile(rf"(?i)^(?:{SECRET_FIELD})$")


def redact_pem(text: str) -> str:
    """Every private key PEM block (or its start, when cut) replaced by a marker."""
    return PEM_PRIVATE.sub(lambda m: f"-----{MARK} {m.group(1)}-----", text)


def redact_fields(text: str) -> str:
    """Credential fields (YAML and JSON), Bearer headers, tokens.csv token columns and
    bootstrap tokens."""
    text = YAML_FIELD.sub(lambda m: m.group(1) + MARK, text)
    text = JSON_FIELD.sub(lambda m: f'{m.group(1)}"{MARK}"', text)
    text = BEARER.sub(lambda m: m.group(1) + MARK, text)
    text = BOOTSTRAP_TOKEN.sub(MARK, text)
    return TOKENS_CSV_LINE.sub(MARK, text)


def redact_known(text: str, secrets: Iterable[str]) -> str:
    """Every occurrence of each known secret (longest first) replaced."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        if len(secret) >= MIN_SECRET and secret in text:
            text = text.replace(secret, MARK)
    return text


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """All of it: PEM blocks, credential fields, then the cluster's known secrets."""
    return redact_known(redact_fields(redact_pem(text)), secrets)


def redact_object(obj: Any) -> Any:
    """A copy of a decoded JSON/YAML value with credential-named keys' values replaced."""
    if isinstance(obj, dict):
        return {
            k: MARK if isinstance(k, str) and SECRET_KEY_NAME.match(k) else redact_object(v)
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [redact_object(v) for v in obj]
    return obj


def pem_secrets(text: str) -> Iterator[str]:
    """A private key's secret forms: every body line, and the base64 of the whole block."""
    for match in PEM_PRIVATE.finditer(text):
        block = match.group(0)
        for line in block.splitlines()[1:]:
            if not line.startswith("-----") and len(line.strip()) >= MIN_SECRET:
                yield line.strip()
        yield base64.b64encode((block + "\n").encode()).decode()
        yield base64.b64encode(block.encode()).decode()


def kubeconfig_secrets(text: str) -> Iterator[str]:
    """The tokens, passwords and client keys of a kubeconfig (raw and decoded)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return
    users = doc.get("users") if isinstance(doc, dict) else None
    for entry in users if isinstance(users, list) else []:
        user = entry.get("user") if isinstance(entry, dict) else None
        if not isinstance(user, dict):
            continue
        for key in ("token", "password", "client-key-data"):
            value = user.get(key)
            if isinstance(value, str) and value:
                yield value.strip()
        data = user.get("client-key-data")
        if isinstance(data, str):
            with contextlib.suppress(ValueError):
                yield from pem_secrets(base64.b64decode(data).decode(errors="replace"))


def file_secrets(path: Path, text: str) -> Iterator[str]:
    """The secrets one file holds, judged by its name and its content."""
    name = path.name.lower()
    yield from pem_secrets(text)
    if "kubeconfig" in name or name.endswith(".conf") or name == "config":
        yield from kubeconfig_secrets(text)
    if name.endswith((".csv", ".csv.imported")) and "token" in name:
        for line in text.splitlines():
            token = line.split(",", 1)[0].strip()
            if token and not token.startswith("#"):
                yield token
    elif "token" in name and not name.endswith((".lock", ".log")):
        value = text.strip()
        if value and "\n" not in value and " " not in value:
            yield value


def _files(root: Path) -> Iterator[Path]:
    if not root.is_dir():
        yield root.resolve()  # a file named on purpose: followed if a symlink
        return
    for top, dirs, names in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(names):
            yield Path(top) / name


def known_secrets(roots: Iterable[Path]) -> set[str]:
    """Every secret found in or under ``roots`` (files or directories): tokens files,
    token files, kubeconfigs and private keys (regular files of at most 1 MiB, symlinks
    not followed)."""
    found: set[str] = set()
    for root in roots:
        for path in _files(root):
            try:
                if not path.is_file() or path.is_symlink() or path.stat().st_size > READ_LIMIT:
                    continue
                text = path.read_bytes().decode(errors="replace")
            except OSError:
                continue
            found.update(s for s in file_secrets(path, text) if len(s) >= MIN_SECRET)
    return found
