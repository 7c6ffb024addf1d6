"""The CNI side of the agent: the plugin and conflist for runtimes, and the CNI server.

The server answers the shim's ``POST /cni`` on a root-only unix socket with ``PodManager``.

Protocol (see ``podnet.cni.shim``): the body is ``{"env": {CNI_*}, "config": "<stdin>"}``;
a 200 answer carries ADD's result (empty for the other commands), anything else a CNI
error object. Requests run concurrently across containers and serially per container
(``ContainerLocks``, held by ``PodManager.handle``).

Error codes (the spec reserves 100+ for plugins; 100 and 101 are the shim's):

- 102 ``ERR_IPAM``: no address could be allocated. IP exhaustion is reported with the IPAM
  message (``no IP addresses available in range set: <start>-<end>``). It is not code 11:
  the condition is not transient by itself (only a DEL on this node clears it), and
  runtimes retry sandbox creation anyway; STATUS reports the same condition as 50.
- 103 ``ERR_DATAPLANE``: the data plane could not wire or unwire the pod (also: ADD of an
  interface that already exists).
- 104 ``ERR_CHECK``: CHECK found the attachment missing or different from prevResult.
- 11 when the IPAM lock stays busy; 50/51 from STATUS; 101 for a bug (logged).

The socket's directory is created 0700 and the socket is 0600, as OpenShift SDN's. A
stale socket file (its agent was killed) is removed at start; if another agent still
answers on it, the server refuses to start.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import logging
import os
import socket
import stat
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from ipaddress import IPv4Network
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from podnet.agent.config import AgentConfig
from podnet.cni.build import C_SOURCE, PLUGIN_NAME, PY_SOURCES, SOURCE_DIR, install_shim
from podnet.cni.types import (
    AGENT_PATH,
    ERR_INTERNAL,
    ERR_TRY_AGAIN_LATER,
    CniError,
    CniRequest,
    CniResult,
    Interface,
    IPConfig,
    Route,
    error_answer,
    parse_request,
    result_answer,
)
from podnet.dataplane.interface import DataPlaneError, PodAttachment
from podnet.ipam.hostlocal import IpamError, IpamLockTimeout

if TYPE_CHECKING:
    from podnet.agent.pods import PodManager  # pods imports this module

log = logging.getLogger("podnet.agent.cni")

ERR_IPAM = 102
ERR_DATAPLANE = 103
ERR_CHECK = 104


SOCKET_MODE = 0o600
DIR_MODE = 0o700
MAX_BODY = 4 * 1024 * 1024  # a GC with many attachments stays far below this
TIMINGS_KEPT = 1000
DEFAULT_ROUTE = IPv4Network("0.0.0.0/0")
REQUEST_TIMEOUT = 55.0  # seconds per CNI request: below the shims' 60 s, so they hear why


def cni_result(attachment: PodAttachment, routes: Iterable[IPv4Network]) -> CniResult:
    """The ADD result: host veth, pod interface (index 1) with its address, and the pod's
    routes via the gateway: the default route (every backend adds it) and ``routes``."""
    routes = (DEFAULT_ROUTE, *routes)
    host = Interface(attachment.host_ifname)
    pod = Interface(attachment.ifname, attachment.mac, attachment.mtu, attachment.sandbox)
    gateway = str(attachment.gateway)
    return CniResult(
        interfaces=(host, pod),
        ips=(IPConfig(str(attachment.address), gateway, 1),),
        routes=tuple(Route(str(dst), gateway) for dst in routes),
    )


class ContainerLocks:
    """One lock per container ID: requests are serial per container, concurrent across."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def busy(self, container_id: str) -> bool:
        """Whether a request for ``container_id`` is in progress or waiting."""
        return container_id in self._locks

    @asynccontextmanager
    async def hold(self, container_id: str) -> AsyncIterator[None]:
        """Hold the container's lock; the entry disappears when nobody uses it."""
        lock, users = self._locks.get(container_id) or (asyncio.Lock(), 0)
        self._locks[container_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[container_id]
            if users == 1:
                del self._locks[container_id]
            else:
                self._locks[container_id] = (lock, users - 1)


def as_cni_error(exc: Exception) -> CniError:
    """The CNI error for a failure of IPAM, the data plane, or a bug."""
    if isinstance(exc, CniError):
        return exc
    if isinstance(exc, TimeoutError):
        return CniError(ERR_TRY_AGAIN_LATER, "timed out", f"no answer in {REQUEST_TIMEOUT:.0f} s")
    if isinstance(exc, IpamLockTimeout):
        return CniError(ERR_TRY_AGAIN_LATER, "IPAM is busy", str(exc))
    if isinstance(exc, IpamError):
        return CniError(ERR_IPAM, str(exc), "address allocation failed")
    if isinstance(exc, DataPlaneError):
        return CniError(ERR_DATAPLANE, "data plane failure", str(exc))
    log.error("internal error handling a CNI request", exc_info=exc)
    return CniError(ERR_INTERNAL, "internal error in podnet agent", f"{type(exc).__name__}: {exc}")


class CniServerError(Exception):
    """The CNI server cannot start (socket path unusable, or another agent serves it)."""


def prepare_socket_dir(directory: Path) -> None:
    """Create the socket's directory 0700. An existing one is tightened only when it
    belongs to the agent alone (not group/world writable, e.g. never /tmp)."""
    if not directory.exists():
        directory.mkdir(parents=True, mode=DIR_MODE)
        os.chmod(directory, DIR_MODE)  # mkdir's mode is cut by the umask
        return
    mode = stat.S_IMODE(directory.stat().st_mode)
    if mode & 0o022:
        log.warning(
            "socket directory %s is mode %o; not changing a shared directory", directory, mode
        )
    elif mode != DIR_MODE:
        os.chmod(directory, DIR_MODE)


def claim_socket_path(path: Path) -> None:
    """Remove a stale socket at ``path``; raise if a live agent answers on it."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise CniServerError(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        log.info("removing stale CNI socket %s", path)
        path.unlink(missing_ok=True)
        return
    except OSError as exc:
        raise CniServerError(f"cannot tell whether an agent serves {path}: {exc}") from exc
    finally:
        probe.close()
    raise CniServerError(f"another podnet agent is serving on {path}")


def _summary(req: CniRequest, result: CniResult | None) -> str:
    who = f"{req.container_id}/{req.ifname}" if req.container_id else ""
    pod = req.args.get("K8S_POD_NAME")
    if pod:
        who += f" ({req.args.get('K8S_POD_NAMESPACE', '')}/{pod})"
    if result is not None and result.ips:
        who += f" -> {result.ips[0].address}"
    return who


def conflist(config: AgentConfig, mtu: int) -> str:
    """The CNI config list runtimes read: podnet, then portmap for hostPorts."""
    plugin = {"type": "podnet", "socketPath": str(config.socket_path), "mtu": mtu}
    portmap = {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True}
    doc = {"cniVersion": "1.0.0", "name": config.network_name, "plugins": [plugin, portmap]}
    return json.dumps(doc, indent=2) + "\n"


def write_if_changed(path: Path, text: str, mode: int = 0o644) -> bool:
    """Write ``text`` atomically unless the file already holds it; True if written."""
    with contextlib.suppress(OSError):
        if path.read_text() == text:
            return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        tmp.chmod(mode)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return True


def _digest(*paths: Path, extra: str = "") -> str:
    digest = hashlib.sha256(extra.encode())
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def install_plugin_once(bin_dir: Path, python: str, stamp_file: Path) -> tuple[Path, bool]:
    """Install the CNI plugin unless the one in ``bin_dir`` was built from the same
    sources (a restart then skips the ~2 s compile). Returns (path, installed)."""
    sources = [C_SOURCE, *(SOURCE_DIR / name for name in PY_SOURCES)]
    stamp = _digest(*sources, extra=os.path.realpath(python))
    plugin = bin_dir / PLUGIN_NAME
    with contextlib.suppress(OSError):
        if stamp_file.read_text().split() == [stamp, _digest(plugin)]:
            return plugin, False
    plugin = install_shim(bin_dir, python)
    write_if_changed(stamp_file, f"{stamp} {_digest(plugin)}\n", 0o600)
    return plugin, True


class CniServer:
    """Serves ``POST /cni`` on ``socket_path`` with a ``PodManager``."""

    def __init__(self, socket_path: Path, pods: PodManager) -> None:
        self.socket_path = Path(socket_path)
        self.pods = pods
        # Agent-side milliseconds per command (most recent ones), for logs and benchmarks.
        self.timings: dict[str, collections.deque[float]] = collections.defaultdict(
            lambda: collections.deque(maxlen=TIMINGS_KEPT)
        )
        self._runner: web.AppRunner | None = None
        self._inode: int | None = None

    async def start(self) -> None:
        """Bind the socket (0600, in a 0700 directory) and serve."""
        prepare_socket_dir(self.socket_path.parent)
        claim_socket_path(self.socket_path)
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post(AGENT_PATH, self._serve)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.UnixSite(self._runner, str(self.socket_path)).start()
        os.chmod(self.socket_path, SOCKET_MODE)
        self._inode = os.lstat(self.socket_path).st_ino
        log.info("CNI server listening on %s", self.socket_path)

    async def stop(self) -> None:
        """Stop serving and remove the socket (if it is still ours)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        with contextlib.suppress(OSError):
            if os.lstat(self.socket_path).st_ino == self._inode:
                self.socket_path.unlink()

    async def _serve(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        body = await request.read()
        try:
            req = parse_request(body)
        except CniError as err:
            log.warning("CNI request refused: %s", err)
            return _response(*error_answer(err))
        status, payload = await self.answer(req)
        elapsed = (time.perf_counter() - started) * 1000
        self.timings[req.command].append(elapsed)
        return _response(status, payload)

    async def answer(self, req: CniRequest) -> tuple[int, bytes]:
        """Run one parsed request; (HTTP status, body) per ``podnet.cni.types``."""
        started = time.perf_counter()
        try:
            result = await self.pods.handle(req)
        except Exception as exc:
            err = as_cni_error(exc)
            log.warning(
                "CNI %s %s failed: %s (code %d)", req.command, _summary(req, None), err, err.code
            )
            return error_answer(err, req.cni_version)
        elapsed = (time.perf_counter() - started) * 1000
        level = logging.DEBUG if req.command == "STATUS" else logging.INFO
        log.log(level, "CNI %s %s ok in %.1f ms", req.command, _summary(req, result), elapsed)
        return result_answer(result, req.cni_version)


def _response(status: int, payload: bytes) -> web.Response:
    return web.Response(status=status, body=payload, content_type="application/json")
