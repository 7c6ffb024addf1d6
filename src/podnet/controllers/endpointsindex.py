"""What the endpoints controller knows of pods: by namespace/name, and by label.

A Service reconcile asks for the pods its selector matches in its namespace; the index
answers from the smallest of the selector's (namespace, key, value) sets, so the cost
follows the pods that carry the rarest label, not all pods of the namespace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podnet.controllers.cache import ObjectCache, namespaced_key
from podnet.controllers.endpointsdesired import labels_of, meta_of

Obj = dict[str, Any]
LabelKey = tuple[str, str, str]  # namespace, label key, label value


class PodIndex:
    """The newest version of every pod, and the pods of each (namespace, label) pair."""

    def __init__(self) -> None:
        self.cache = ObjectCache(namespaced_key)
        self._by_label: dict[LabelKey, set[str]] = {}

    def __len__(self) -> int:
        return len(self.cache)

    def get(self, key: str) -> Obj | None:
        return self.cache.get(key)

    def put(self, pod: Obj) -> tuple[bool, Obj | None]:
        """Store a pod version (unless stale): (stored, the version it replaced)."""
        stored, old = self.cache.put(pod)
        if stored:
            if old is not None:
                self._unindex(old)
            self._index(pod)
        return stored, old

    def remove(self, key: str, revision: int) -> Obj | None:
        """Forget a deleted pod; the version removed, or None."""
        old = self.cache.remove(key, revision)
        if old is not None:
            self._unindex(old)
        return old

    def matching(self, namespace: str, selector: Mapping[str, str]) -> list[Obj]:
        """The pods of ``namespace`` whose labels include ``selector`` (none if empty)."""
        if not selector:
            return []
        sets = [self._by_label.get((namespace, k, v), set()) for k, v in selector.items()]
        smallest = min(sets, key=len)
        keys = sorted(k for k in smallest if all(k in s for s in sets))
        return [pod for k in keys if (pod := self.cache.get(k)) is not None]

    def _label_keys(self, pod: Obj) -> list[LabelKey]:
        namespace = str(meta_of(pod).get("namespace") or "")
        return [(namespace, k, str(v)) for k, v in labels_of(pod).items()]

    def _index(self, pod: Obj) -> None:
        key = namespaced_key(pod)
        for label in self._label_keys(pod):
            self._by_label.setdefault(label, set()).add(key)

    def _unindex(self, pod: Obj) -> None:
        key = namespaced_key(pod)
        for label in self._label_keys(pod):
            members = self._by_label.get(label)
            if members is not None:
                members.discard(key)
                if not members:
                    del self._by_label[label]
