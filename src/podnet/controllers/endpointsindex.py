"""What the endpoints controller knows of pods and Services, indexed by label.

A Service reconcile asks for the pods its selector matches in its namespace; the pod
index answers from the smallest of the selector's (namespace, key, value) sets, so the
cost follows the pods that carry the rarest label, not all pods of the namespace. A pod
change asks which Services may select the pod; the Service index answers from the pod's
own labels, not from every Service of the namespace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from podnet.client.watch import DELETED
from podnet.controllers.cache import ObjectCache, namespaced_key, revision_of
from podnet.controllers.endpointsdesired import labels_of, meta_of, selector_of

Obj = dict[str, Any]
LabelKey = tuple[str, str, str]  # namespace, label key, label value


def _label_keys(obj: Obj) -> list[LabelKey]:
    namespace = str(meta_of(obj).get("namespace") or "")
    return [(namespace, k, str(v)) for k, v in labels_of(obj).items()]


class Versions(Protocol):
    """What ``follow`` keeps in step: an ``ObjectCache`` or a ``LabelIndex``."""

    def put(self, obj: Obj) -> tuple[bool, Obj | None]: ...

    def remove(self, key: str, revision: int) -> Obj | None: ...


def follow(versions: Versions, change: str, obj: Obj) -> list[Obj] | None:
    """Apply one watch event to ``versions``: the versions it concerns (the one replaced
    or removed, and ``obj``), or None when ``obj`` is stale and changes nothing."""
    if change == DELETED:
        old = versions.remove(namespaced_key(obj), revision_of(obj))
    else:
        stored, old = versions.put(obj)
        if not stored:
            return None
    return [obj] if old is None else [old, obj]


class LabelIndex:
    """The newest version of each object (by namespace/name), filed under label pairs."""

    def __init__(self) -> None:
        self.cache = ObjectCache(namespaced_key)
        self._by_label: dict[LabelKey, set[str]] = {}

    def __len__(self) -> int:
        return len(self.cache)

    def get(self, key: str) -> Obj | None:
        return self.cache.get(key)

    def filed_under(self, obj: Obj) -> list[LabelKey]:
        """The label pairs ``obj`` is filed under."""
        raise NotImplementedError

    def put(self, obj: Obj) -> tuple[bool, Obj | None]:
        """Store a version (unless stale): (stored, the version it replaced)."""
        stored, old = self.cache.put(obj)
        if stored:
            if old is not None:
                self._unfile(old)
            for label in self.filed_under(obj):
                self._by_label.setdefault(label, set()).add(namespaced_key(obj))
        return stored, old

    def remove(self, key: str, revision: int) -> Obj | None:
        """Forget a deleted object; the version removed, or None."""
        old = self.cache.remove(key, revision)
        if old is not None:
            self._unfile(old)
        return old

    def keys_under(self, label: LabelKey) -> set[str]:
        return self._by_label.get(label, set())

    def _unfile(self, obj: Obj) -> None:
        key = namespaced_key(obj)
        for label in self.filed_under(obj):
            members = self._by_label.get(label)
            if members is not None:
                members.discard(key)
                if not members:
                    del self._by_label[label]


class PodIndex(LabelIndex):
    """Pods, filed under every label they carry."""

    def filed_under(self, obj: Obj) -> list[LabelKey]:
        return _label_keys(obj)

    def matching(self, namespace: str, selector: Mapping[str, str]) -> list[Obj]:
        """The pods of ``namespace`` whose labels include ``selector`` (none if empty)."""
        if not selector:
            return []
        sets = [self.keys_under((namespace, k, v)) for k, v in selector.items()]
        smallest = min(sets, key=len)
        keys = sorted(k for k in smallest if all(k in s for s in sets))
        return [pod for k in keys if (pod := self.cache.get(k)) is not None]


class ServiceIndex(LabelIndex):
    """Services, each filed under one pair of its selector (every pod it selects carries
    that pair); Services without a selector are not filed."""

    def filed_under(self, obj: Obj) -> list[LabelKey]:
        selector = selector_of(obj)
        if not selector:
            return []
        namespace = str(meta_of(obj).get("namespace") or "")
        return [(namespace, *min(selector.items()))]

    def candidates(self, pod: Obj) -> set[str]:
        """Keys of the Services that may select ``pod`` (a superset; check each)."""
        out: set[str] = set()
        for label in _label_keys(pod):
            out |= self.keys_under(label)
        return out
