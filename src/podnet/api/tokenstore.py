"""Where the credential commands find the master's token records: the master's etcd.

``podnet master`` writes its etcd settings (endpoints, key prefix, the paths of its etcd
client certificate: never a secret itself) to ``<state dir>/etcd.json`` (0600) at start.
``podnet node-credentials`` and the other credential commands, ``podnet adm token`` and
``podnet cluster up`` read them from the same state dir (or take ``--etcd`` flags), so
they write the records every master reads. ``run`` runs one coroutine on a store of its
own, in a thread of its own, so synchronous callers (also those inside an event loop,
such as a test's) can use it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from podnet.files import write_atomic
from podnet.store.base import Store
from podnet.store.etcd_pki import EtcdTls

SETTINGS_FILE = "etcd.json"
T = TypeVar("T")


class NoStoreSettings(RuntimeError):
    """No etcd settings: no master ever started on the state dir, and no ``--etcd``."""


@dataclass(frozen=True)
class StoreSettings:
    """How to reach the master's etcd and where its keys live."""

    endpoints: str
    prefix: str
    tls: EtcdTls | None = None

    def save(self, state_dir: Path) -> Path:
        value: dict[str, Any] = {"endpoints": self.endpoints, "prefix": self.prefix}
        if self.tls is not None:
            value["tls"] = {k: str(getattr(self.tls, k)) for k in ("ca", "cert", "key")}
        path = Path(state_dir) / SETTINGS_FILE
        write_atomic(path, json.dumps(value, indent=1) + "\n")
        return path

    @classmethod
    def load(cls, state_dir: Path) -> StoreSettings | None:
        """The settings a master saved in ``state_dir``, or None when there are none."""
        path = Path(state_dir) / SETTINGS_FILE
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise NoStoreSettings(f"cannot read {path}: {exc}") from exc
        try:
            tls = value.get("tls")
            return cls(
                str(value["endpoints"]),
                str(value["prefix"]),
                None
                if tls is None
                else EtcdTls(Path(tls["ca"]), Path(tls["cert"]), Path(tls["key"])),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise NoStoreSettings(f"{path} is not a master's etcd settings file") from exc

    @classmethod
    def require(cls, state_dir: Path) -> StoreSettings:
        settings = cls.load(state_dir)
        if settings is None:
            raise NoStoreSettings(
                f"no {SETTINGS_FILE} in {state_dir}: start `podnet master` on this state dir "
                "first, or give --etcd (and its TLS flags and --etcd-prefix)"
            )
        return settings


def run(settings: StoreSettings, work: Callable[[Store], Awaitable[T]]) -> T:
    """``work(store)`` on a fresh connection to the master's etcd, from synchronous code."""
    from podnet.store.etcd import EtcdStore

    async def main() -> T:
        store = EtcdStore(settings.endpoints, tls=settings.tls)
        await store.connect()
        try:
            return await work(store)
        finally:
            await store.close()

    result: list[T] = []
    failure: list[BaseException] = []

    def thread() -> None:
        try:
            result.append(asyncio.run(main()))
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    worker = threading.Thread(target=thread, name="token-store")
    worker.start()
    worker.join()
    if failure:
        raise failure[0]
    return result[0]


def issue_sync(settings: StoreSettings, user: str, groups: Sequence[str], description: str) -> str:
    """A new token for ``user`` in ``groups``, stored hashed in the master's etcd."""
    from podnet.api.tokenissue import issue

    return run(settings, lambda store: issue(store, settings.prefix, user, groups, description))
