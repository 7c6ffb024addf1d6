"""The agent's CNI server: answers the shim's ``POST /cni`` on a root-only unix socket.

Protocol (see ``podnet.cni.shim``): the body is ``{"env": {CNI_*}, "config": "<stdin>"}``;
a 200 answer carries ADD's result (empty for the other commands), anything else a CNI
error object (codes: ``podnet.agent.cnierrors``). The server hands each parsed request to
a ``CniHandler`` (the agent's ``PodManager``), which runs requests concurrently across
containers and serially per container.

The socket's directory is created 0700 and the socket is 0600, as OpenShift SDN's. A
stale socket file (its agent was killed) is removed at start; if another agent still
answers on it, the server refuses to start.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import socket
import stat
import time
from pathlib import Path
from typing import Protocol

from aiohttp import web

from podnet.agent.cnierrors import as_cni_error
from podnet.agent.cnimetrics import CniMetrics
from podnet.cni.result import CniResult
from podnet.cni.types import (
    AGENT_PATH,
    CniError,
    CniRequest,
    error_answer,
    parse_request,
    result_answer,
)

log = logging.getLogger("podnet.agent.cni")

SOCKET_MODE = 0o600
DIR_MODE = 0o700
MAX_BODY = 4 * 1024 * 1024  # a GC with many attachments stays far below this
TIMINGS_KEPT = 1000


class CniHandler(Protocol):
    """What the server needs from the pod side: one CNI command at a time."""

    async def handle(self, req: CniRequest) -> CniResult | None:
        """Run one CNI command; raise (ideally a ``CniError``) on failure."""
        ...


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


class CniServer:
    """Serves ``POST /cni`` on ``socket_path`` with a ``CniHandler``."""

    def __init__(
        self, socket_path: Path, pods: CniHandler, metrics: CniMetrics | None = None
    ) -> None:
        """``metrics``: counts and times each command (``podnet.agent.cnimetrics``)."""
        self.socket_path = Path(socket_path)
        self.pods = pods
        self.metrics = metrics
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
            if self.metrics is not None:
                self.metrics.observe("other", False, time.perf_counter() - started)
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
            self._count(req.command, False, started)
            return error_answer(err, req.cni_version)
        self._count(req.command, True, started)
        elapsed = (time.perf_counter() - started) * 1000
        level = logging.DEBUG if req.command == "STATUS" else logging.INFO
        log.log(level, "CNI %s %s ok in %.1f ms", req.command, _summary(req, result), elapsed)
        return result_answer(result, req.cni_version)

    def _count(self, command: str, ok: bool, started: float) -> None:
        if self.metrics is not None:
            self.metrics.observe(command, ok, time.perf_counter() - started)


def _response(status: int, payload: bytes) -> web.Response:
    return web.Response(status=status, body=payload, content_type="application/json")
