"""Where API objects live in the store: one key per object under the registry prefix.

``{prefix}{group or "core"}/{plural}/[{namespace}/]{name}`` for an object, and
``{prefix}claims/{group or "core"}/{plural}/{path}`` for a unique value one holds
(``podnet.api.claims``). Other keys under the prefix (the leader lease) are not objects.
"""

from __future__ import annotations

from podnet.api.claims import Claim
from podnet.model import errors
from podnet.model.kinds import KINDS, Kind

DEFAULT_PREFIX = "/podnet/registry/"


class KeySpace:
    """Object keys under one prefix, both ways."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self._kinds = {(k.group or "core", k.plural): k for k in KINDS.kinds}

    def kind_prefix(self, kind: Kind, namespace: str | None = None) -> str:
        """Key prefix of every object of ``kind`` (in ``namespace``, if given)."""
        base = f"{self.prefix}{kind.group or 'core'}/{kind.plural}/"
        return base + f"{namespace}/" if kind.namespaced and namespace else base

    def key(self, kind: Kind, namespace: str | None, name: str) -> str:
        if kind.namespaced:
            if not namespace:
                raise errors.bad_request(f"{kind.plural} are namespaced: a namespace is required")
            return f"{self.kind_prefix(kind)}{namespace}/{name}"
        return f"{self.kind_prefix(kind)}{name}"

    def claim_key(self, kind: Kind, claim: Claim) -> str:
        return f"{self.prefix}claims/{kind.group or 'core'}/{kind.plural}/{claim.path}"

    def parse_key(self, key: str) -> tuple[Kind, str | None, str] | None:
        """(kind, namespace, name) of an object key, or None for other keys."""
        if not key.startswith(self.prefix):
            return None
        parts = key[len(self.prefix) :].split("/")
        if len(parts) < 3 or parts[0] == "claims":
            return None
        kind = self._kinds.get((parts[0], parts[1]))
        if kind is None:
            return None
        if kind.namespaced and len(parts) == 4:
            return kind, parts[2], parts[3]
        if not kind.namespaced and len(parts) == 3:
            return kind, None, parts[2]
        return None
