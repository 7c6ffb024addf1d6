"""The types of the kind table (``podnet.model.kinds``): a kind and its table columns."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Column:
    """One column of a table view (``kubectl get``): header and how to read the cell."""

    name: str
    read: Callable[[Obj], Any]
    wide_only: bool = False


@dataclass(frozen=True)
class Kind:
    """A resource type: where it lives in the API and how it is shown."""

    group: str  # "" for the core group
    version: str
    kind: str
    plural: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    columns: tuple[Column, ...] = ()
    subresources: tuple[str, ...] = ()
    # Field of the object whose value must be unique across all objects of the kind,
    # guarded by an etcd transaction (HostSubnet.subnet).
    unique_field: str | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    def base_path(self) -> str:
        """URL prefix of the group version: ``/api/v1`` or ``/apis/<group>/<version>``."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def names(self) -> set[str]:
        """Every name a user may type for this kind (case-insensitive)."""
        qualified = {f"{self.plural}.{self.group}", f"{self.singular}.{self.group}"}
        return {self.plural, self.singular, self.kind.lower(), *self.short_names} | (
            qualified if self.group else set()
        )


def meta(*path: str) -> Callable[[Obj], Any]:
    """A reader of the value at ``path`` (None when it is missing)."""

    def read(obj: Obj) -> Any:
        node: Any = obj
        for part in path:
            if not isinstance(node, Mapping):
                return None
            node = node.get(part)
        return node

    return read
