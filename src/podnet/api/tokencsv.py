"""kube-apiserver's ``--token-auth-file`` CSV: ``token,user,uid[,"group1,group2"]``.

The legacy format a master imports into etcd once (``podnet.api.tokenissue``) and
``podnet.api.auth.TokenFile`` reads.
"""

from __future__ import annotations

import csv
import io

from podnet.api.identity import User


def _parse_row(row: list[str], where: str) -> tuple[str, User]:
    if len(row) < 3 or not row[0] or not row[1]:
        raise ValueError(f'{where}: want token,user,uid[,"group1,group2"], got {row!r}')
    token, user = row[0].strip(), row[1].strip()
    groups = row[3].split(",") if len(row) > 3 else []
    return token, User(user, tuple(g.strip() for g in groups if g.strip()))


def parse_token_rows(text: str, source: str = "<tokens>") -> list[tuple[str, User, str]]:
    """(token, user, uid) of each row of token-file CSV text, in order."""
    out = []
    for lineno, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        token, user = _parse_row(row, f"{source}:{lineno}")
        out.append((token, user, row[2].strip()))
    return out


def parse_token_file(text: str, source: str = "<tokens>") -> dict[str, User]:
    """Parse token-file CSV text into token -> User; blank and ``#`` lines are skipped."""
    return {token: user for token, user, _ in parse_token_rows(text, source)}
