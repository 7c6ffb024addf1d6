"""Revoking a node's credentials (``podnet adm node remove``).

Today a node's credential is its bearer token, a row of the master's ``tokens.csv``
(``podnet.api.auth``): revoking removes every row of user ``system:node:<node>``, with
the file rewritten atomically under the lock ``add_token`` takes, so a token issued at
the same moment is not lost. The master re-reads the file within ``RECHECK_SECONDS``.

This is the one place that knows where node credentials live: when tokens move into
etcd, only ``revoke_node_credentials`` changes.
"""

from __future__ import annotations

import csv
from pathlib import Path

from podnet.api.auth import _locked
from podnet.api.identity import node_user
from podnet.files import write_atomic

__all__ = ["revoke_node_credentials", "token_rows_of", "without_user"]


def _user_of(line: str) -> str | None:
    """The user column of one token-file line (None for blank and comment lines)."""
    if not line.strip() or line.lstrip().startswith("#"):
        return None
    row = next(csv.reader([line]), [])
    return row[1].strip() if len(row) > 1 else None


def without_user(text: str, user: str) -> tuple[str, int]:
    """``text`` (token-file CSV) without the rows of ``user``, and how many there were;
    every other line is kept as it is."""
    kept, dropped = [], 0
    for line in text.splitlines(keepends=True):
        if _user_of(line) == user:
            dropped += 1
        else:
            kept.append(line)
    return "".join(kept), dropped


def token_rows_of(tokens_path: Path, node: str) -> int:
    """How many token rows node ``node`` has (0 when the file is missing)."""
    try:
        text = tokens_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return 0
    return without_user(text, node_user(node))[1]


def revoke_node_credentials(tokens_path: Path, node: str) -> int:
    """Remove node ``node``'s tokens from ``tokens_path``; how many rows were removed
    (0: it had none, and the file is left untouched)."""
    if not node:
        raise ValueError("node name must not be empty")
    with _locked(tokens_path):
        try:
            text = tokens_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return 0
        rest, dropped = without_user(text, node_user(node))
        if dropped:
            write_atomic(tokens_path, rest)
        return dropped
