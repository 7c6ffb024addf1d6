"""An aetcd client that speaks TLS with a client certificate and fails over between members.

aetcd 1.x opens only an insecure channel to one ``host:port``. ``EtcdClient`` opens one gRPC
channel over *all* members instead (``ipv4:a:p,b:p,...`` with gRPC's ``pick_first``
policy): when the member in use dies or refuses, the channel moves to the next member by
itself, and after an etcd restart it reconnects with a short, jittered backoff (gRPC's own
default grows to two minutes, which kept a master away from a restarted etcd for as long).

Every member's serving certificate names ``MEMBER_TLS_NAME``, which the client checks
instead of the address it dialled, so one channel can verify members at any address.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from typing import Any

import aetcd
import grpc
from aetcd import rpc, watcher

from podnet.store.etcd_pki import MEMBER_TLS_NAME, EtcdTls

CHANNEL_OPTIONS: dict[str, Any] = {
    "grpc.initial_reconnect_backoff_ms": 200,
    # (not grpc.min_reconnect_backoff_ms: it is also the connect timeout, kept at 20 s)
    "grpc.max_reconnect_backoff_ms": 2000,
    # Notice a silent member (no RST, e.g. a frozen host) within ~15 s; etcd's default
    # --grpc-keepalive-min-time is 5 s, so pings every 10 s are allowed.
    "grpc.keepalive_time_ms": 10000,
    "grpc.keepalive_timeout_ms": 5000,
    "grpc.lb_policy_name": "pick_first",
    # gRPC refuses answers over 4 MiB by default. One watch response holds every event of
    # a revision (a transaction of many keys), and a watcher catching up gets up to 1,000
    # revisions in one: over 4 MiB the stream fails at the same revision on every retry,
    # and the master's watch cache stops there for good. kube-apiserver's etcd client
    # takes answers of any size (MaxCallRecvMsgSize = MaxInt32); so does this one.
    "grpc.max_receive_message_length": 2**31 - 1,
}


class EndpointError(ValueError):
    """An ``--etcd`` value that is not ``[scheme://]host:port[,...]``."""


def parse_endpoints(value: str | Sequence[str]) -> list[tuple[str, int]]:
    """``host:port`` pairs from comma-separated and/or repeated values (a scheme is ignored)."""
    items = [value] if isinstance(value, str) else list(value)
    out: list[tuple[str, int]] = []
    for raw in (part.strip() for item in items for part in item.split(",")):
        if not raw:
            continue
        hostport = raw.split("://", 1)[-1].rstrip("/")
        host, sep, port = hostport.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise EndpointError(f"bad etcd endpoint {raw!r}: expected host:port")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise EndpointError("no etcd endpoint given")
    return out


def _addresses(host: str, port: int) -> list[str]:
    try:
        ipaddress.IPv4Address(host)
        return [f"{host}:{port}"]
    except ValueError:
        pass
    infos = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
    return sorted({f"{info[4][0]}:{port}" for info in infos})


def grpc_target(endpoints: Sequence[tuple[str, int]]) -> str:
    """One gRPC target over every member, in the given order (names resolved now)."""
    addresses: list[str] = []
    for host, port in endpoints:
        addresses += [a for a in _addresses(host, port) if a not in addresses]
    return "ipv4:" + ",".join(addresses)


class EtcdClient(aetcd.Client):
    """``aetcd.Client`` over a TLS (or plain) channel to several members."""

    def __init__(
        self, endpoints: Sequence[tuple[str, int]], tls: EtcdTls | None, timeout: int
    ) -> None:
        host, port = endpoints[0]
        options = dict(CHANNEL_OPTIONS)
        if tls is not None:
            options["grpc.ssl_target_name_override"] = MEMBER_TLS_NAME
        super().__init__(host=host, port=port, timeout=timeout, options=options)
        self._endpoints = list(endpoints)
        self._tls = tls

    async def connect(self) -> None:
        """Open the channel (lazily: no member needs to be up yet) and the stubs."""
        if self._connected.is_set():
            return
        target = grpc_target(self._endpoints)
        options = list(self._options.items())
        if self._tls is None:
            self.channel = rpc.insecure_channel(target, options=options)
        else:
            ca, key, cert = self._tls.read()
            creds = grpc.ssl_channel_credentials(ca, key, cert)
            self.channel = rpc.secure_channel(target, creds, options=options)
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)
        self._watcher = watcher.Watcher(
            rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
        )
        self._connected.set()
