"""The node's Open vSwitch database, asynchronously: bridges, ports and external_ids.

One long-lived ``ovsdbapp`` connection to the node's private ``ovsdb-server`` (it
reconnects by itself after the server restarts). ``ovsdbapp`` is synchronous and owns a
thread; every write here runs through ``asyncio.to_thread`` with ``check_error=True``
(its default swallows errors) and ``log_errors=False`` (errors are raised, not logged
twice). A write returns once ``ovs-vswitchd`` has applied it, so a new port's ``ofport`` is
known; a port ``ovs-vswitchd`` could not open (``ofport`` -1, ``Interface.error``) or that
did not get the ``ofport`` it asked for is removed again and reported. Reads come from
the connection's cache, under its lock, and never wait for ``ovs-vswitchd``.

Errors are ``DataPlaneError`` (transient: the server or the switch is away, a device is
missing) or ``DataPlaneRejected`` (the request itself is wrong, e.g. a taken ofport).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ovsdbapp.backend.ovs_idl import command, connection, idlutils
from ovsdbapp.schema.open_vswitch import commands, impl_idl

from podnet.dataplane.interface import DataPlaneError, DataPlaneRejected

T = TypeVar("T")
TIMEOUT = 10.0  # seconds for one transaction, including ovs-vswitchd applying it


@dataclass(frozen=True)
class Port:
    """One port of a bridge as the database shows it (its single interface's columns)."""

    name: str
    type: str  # "" for a system device (a veth), "internal", "vxlan"...
    ofport: int  # -1 while (or because) ovs-vswitchd could not open it
    external_ids: dict[str, str] = field(default_factory=dict)
    options: dict[str, str] = field(default_factory=dict)
    error: str | None = None


class _NodeApi(impl_idl.OvsdbIdl):
    """ovsdbapp keeps the connection in a class attribute; one subclass per ``Ovsdb``
    (made in ``_api``) keeps two nodes' connections in one process apart."""

    _ovsdb_connection = None


def _api(conn: connection.Connection) -> _NodeApi:
    node_api = type("NodeOvsdbApi", (_NodeApi,), {"_ovsdb_connection": None})
    return node_api(conn)


class _EnsurePort(command.BaseCommand):
    """Add port ``name`` to ``bridge``, or set the columns of the one that is there; the
    result is True when the port is new."""

    def __init__(self, api: Any, bridge: str, name: str, attrs: dict[str, Any]) -> None:
        super().__init__(api)
        self.bridge, self.name, self.attrs = bridge, name, attrs

    def run_idl(self, txn: Any) -> None:
        port = idlutils.row_by_value(self.api.idl, "Port", "name", self.name, None)
        if port is None:
            commands.AddPortCommand(self.api, self.bridge, self.name, False, **self.attrs).run_idl(
                txn
            )
            self.result = True
            return
        bridge = idlutils.row_by_value(self.api.idl, "Bridge", "name", self.bridge)
        if port not in bridge.ports:
            raise DataPlaneRejected(f"port {self.name} belongs to another bridge")
        self.set_columns(port.interfaces[0], **self.attrs)
        self.result = False


class Ovsdb:
    """An open connection to one node's database (``await Ovsdb.connect(socket)``)."""

    def __init__(self, api: _NodeApi, conn: connection.Connection, timeout: float) -> None:
        self._api, self._conn, self.timeout = api, conn, timeout

    @classmethod
    async def connect(cls, socket: Path, timeout: float = TIMEOUT) -> Ovsdb:
        """Connect to the ``ovsdb-server`` listening on unix socket ``socket``."""

        def opened() -> Ovsdb:
            remote = f"unix:{socket}"
            try:
                idl = connection.OvsdbIdl.from_server(remote, "Open_vSwitch")
                conn = connection.Connection(idl=idl, timeout=timeout)
                return cls(_api(conn), conn, timeout)
            except Exception as error:  # ovsdbapp raises bare Exception and others
                raise DataPlaneError(f"cannot connect to OVSDB at {remote}: {error}") from error

        return await asyncio.to_thread(opened)

    async def close(self) -> None:
        """Stop the connection's thread."""
        await asyncio.to_thread(self._conn.stop, self.timeout)

    async def _write(self, what: str, *cmds: Any) -> list[Any]:
        def commit() -> list[Any]:
            with self._api.transaction(check_error=True, log_errors=False) as txn:
                for cmd in cmds:
                    txn.add(cmd)
            return [cmd.result for cmd in cmds]

        try:
            return await asyncio.to_thread(commit)
        except DataPlaneError:
            raise
        except idlutils.RowNotFound as error:
            raise DataPlaneRejected(f"OVSDB {what}: {error}") from error
        except Exception as error:  # ovsdbapp: RuntimeError, TimeoutException...
            raise DataPlaneError(f"OVSDB {what} failed: {error}") from error

    async def _read(self, read: Callable[[], T]) -> T:
        def locked() -> T:
            with self._conn.lock:  # the connection's thread changes rows under this lock
                return read()

        return await asyncio.to_thread(locked)

    async def ensure_bridge(
        self,
        bridge: str,
        datapath_type: str,
        other_config: Mapping[str, str] | None = None,
        external_ids: Mapping[str, str] | None = None,
    ) -> None:
        """Make ``bridge`` exist with ``datapath_type``, ``fail_mode=secure`` (no flows
        but ours, also while no one programs it), OpenFlow 1.3 only, in-band control off,
        and ``other_config``/``external_ids`` merged into what it has."""
        settings: list[tuple[str, Any]] = [
            ("fail_mode", "secure"),
            ("protocols", ["OpenFlow13"]),
            ("other_config", {"disable-in-band": "true", **(other_config or {})}),
        ]
        if external_ids:
            settings.append(("external_ids", dict(external_ids)))
        await self._write(
            f"ensure bridge {bridge}",
            self._api.add_br(bridge, may_exist=True, datapath_type=datapath_type),
            self._api.db_set("Bridge", bridge, *settings),
        )

    async def delete_bridge(self, bridge: str) -> None:
        """Remove ``bridge`` and its ports (nothing if it is not there)."""
        await self._write(f"delete bridge {bridge}", self._api.del_br(bridge, if_exists=True))

    async def add_port(
        self,
        bridge: str,
        name: str,
        *,
        type: str = "",
        ofport: int | None = None,
        options: Mapping[str, str] | None = None,
        external_ids: Mapping[str, str] | None = None,
    ) -> int:
        """Add port ``name`` (its device for ``type=""``, e.g. a veth; ``internal``;
        ``vxlan`` with ``options``) to ``bridge``, or bring the one there up to date;
        return its ofport. With ``ofport``, the port must get exactly that number."""
        attrs: dict[str, Any] = {
            "type": type,
            "options": dict(options or {}),
            "external_ids": dict(external_ids or {}),
        }
        if ofport is not None:
            attrs["ofport_request"] = ofport
        (created,) = await self._write(
            f"add port {name} to {bridge}", _EnsurePort(self._api, bridge, name, attrs)
        )
        port = await self.port(name)
        problem = _port_problem(port, name, ofport)
        if problem is None and port is not None:
            return port.ofport
        if created:
            await self.delete_port(bridge, name)
        if port is not None and ofport is not None and port.ofport > 0:
            raise DataPlaneRejected(problem)  # the number is taken: asking again won't help
        raise DataPlaneError(problem)

    async def delete_port(self, bridge: str, name: str) -> None:
        """Remove port ``name`` from ``bridge`` (nothing if it is not there)."""
        await self._write(
            f"delete port {name}", self._api.del_port(name, bridge=bridge, if_exists=True)
        )

    async def set_interface(self, name: str, **columns: Any) -> None:
        """Set columns of interface ``name`` (e.g. ``mtu_request=1450``); a map is merged
        into what is there. DataPlaneRejected if there is no such interface."""
        await self._write(
            f"set {', '.join(columns)} of {name}",
            self._api.db_set("Interface", name, *columns.items(), if_exists=False),
        )

    async def port(self, name: str) -> Port | None:
        """Port ``name`` as the database shows it now, or None."""

        def read() -> Port | None:
            row = idlutils.row_by_value(self._api.idl, "Port", "name", name, None)
            return None if row is None else _port(row)

        return await self._read(read)

    async def ports(self, bridge: str) -> list[Port]:
        """The ports of ``bridge`` but the bridge's own, by name; [] if it is not there."""

        def read() -> list[Port]:
            row = idlutils.row_by_value(self._api.idl, "Bridge", "name", bridge, None)
            if row is None:
                return []
            return sorted((_port(p) for p in row.ports if p.name != bridge), key=_name)

        return await self._read(read)

    async def bridge_external_ids(self, bridge: str) -> dict[str, str] | None:
        """The external_ids of ``bridge``, or None when there is no such bridge."""

        def read() -> dict[str, str] | None:
            row = idlutils.row_by_value(self._api.idl, "Bridge", "name", bridge, None)
            return None if row is None else dict(row.external_ids)

        return await self._read(read)

    async def set_bridge_external_ids(self, bridge: str, ids: Mapping[str, str]) -> None:
        """Merge ``ids`` into the external_ids of ``bridge`` (other keys stay)."""
        await self._write(
            f"set external_ids of {bridge}",
            self._api.db_set("Bridge", bridge, ("external_ids", dict(ids)), if_exists=False),
        )


def _name(port: Port) -> str:
    return port.name


def _port(row: Any) -> Port:
    iface = row.interfaces[0] if row.interfaces else None
    if iface is None:
        return Port(row.name, "", -1)
    return Port(
        name=row.name,
        type=iface.type,
        ofport=iface.ofport[0] if iface.ofport else -1,
        external_ids=dict(iface.external_ids),
        options=dict(iface.options),
        error=iface.error[0] if iface.error else None,
    )


def _port_problem(port: Port | None, name: str, ofport: int | None) -> str | None:
    """What is wrong with port ``name`` after it was added, or None."""
    if port is None:
        return f"port {name} is gone right after it was added"
    if port.error or port.ofport <= 0:
        return f"ovs-vswitchd cannot open port {name}: {port.error or 'no ofport'}"
    if ofport is not None and port.ofport != ofport:
        return f"port {name} asked for ofport {ofport} but got {port.ofport} (taken?)"
    return None
