"""The podnet CNI plugin in Python: the fallback for the C shim (``podnet-cni.c``).

The container runtime executes the plugin with the ``CNI_*`` variables and the network
config on stdin. VERSION and every check of ``validate`` are answered here; ADD, DEL,
CHECK, STATUS and GC go to the node agent:

    POST /cni HTTP/1.1 on the unix socket
    body:   {"env": {every CNI_* variable}, "config": "<stdin text>"}
    2xx:    the body is the CNI answer (ADD's result; empty for the rest), exit 0
    other:  the body is a CNI error object, printed as is, exit 1

Socket: the config's ``socketPath``, else ``$PODNET_CNI_SOCKET``, else
``/var/run/podnet/cni-server.sock``. When the agent cannot be reached (no socket, refused,
timed out, closed early) the answer is code 11 "try again later" (50 for STATUS); a
non-2xx answer that is not a CNI error becomes code 100 (50 for STATUS). DEL gets
11 too: it is still best effort, but succeeding without the agent would leak the pod's
address and ports, and the spec lets the runtime retry a failed DEL.

Stdlib only, never importing podnet, so that ``python -I -S shim.py`` starts fast. Errors
go to stdout as JSON with exit status 1; nothing ever prints a traceback.
"""

from __future__ import annotations

import json
import os
import sys

try:
    from . import validate
except ImportError:
    # Run as a script or from the installed launcher: validate.py is a sibling file. The
    # directory is on sys.path for this import only, so the sibling types.py can never
    # shadow the stdlib's types module.
    sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
    try:
        import validate  # type: ignore[no-redef]
    finally:
        del sys.path[0]

TYPE_CHECKING = False
if TYPE_CHECKING:
    import http.client
    from collections.abc import Mapping
    from typing import Any

DEFAULT_SOCKET = "/var/run/podnet/cni-server.sock"
SOCKET_ENV = "PODNET_CNI_SOCKET"
TIMEOUT_ENV = "PODNET_CNI_TIMEOUT"
AGENT_PATH = "/cni"
# Seconds to wait for the agent, per command: here per socket operation, in the C shim
# for the whole exchange. $PODNET_CNI_TIMEOUT overrides them.
TIMEOUTS = {"ADD": 60.0, "DEL": 60.0, "CHECK": 30.0, "GC": 120.0, "STATUS": 10.0}


class AgentUnreachable(Exception):
    """The agent did not answer: no socket, refused, timed out or closed early."""


class AgentError(Exception):
    """The agent answered with a CNI error object, to be printed as it is."""

    def __init__(self, answer: bytes) -> None:
        super().__init__("agent returned a CNI error")
        self.answer = answer


def socket_path(config: Mapping[str, Any] | None, env: Mapping[str, str]) -> str:
    """The agent's socket: config ``socketPath``, else $PODNET_CNI_SOCKET, else default."""
    configured = config.get("socketPath") if config is not None else None
    if isinstance(configured, str) and configured:
        return configured
    return env.get(SOCKET_ENV) or DEFAULT_SOCKET


def timeout_for(command: str, env: Mapping[str, str]) -> float:
    """Seconds to wait for the agent: $PODNET_CNI_TIMEOUT if valid, else per command."""
    try:
        override = float(env.get(TIMEOUT_ENV, ""))
    except ValueError:
        override = 0.0
    if 0.0 < override < 1e6:
        return override
    return TIMEOUTS.get(command, 60.0)


def request_body(env: Mapping[str, str], data: bytes) -> bytes:
    """The JSON body sent to the agent: every CNI_* variable and the stdin text."""
    cni_env = {key: value for key, value in env.items() if key.startswith("CNI_")}
    # ensure_ascii: undecodable env bytes (surrogate escapes) travel as \udcXX.
    return json.dumps({"env": cni_env, "config": data.decode("utf-8")}).encode("ascii")


def _connection(path: str, timeout: float) -> http.client.HTTPConnection:
    import http.client
    import socket

    class UnixHTTPConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(self.timeout)
                sock.connect(path)
            except BaseException:
                sock.close()
                raise
            self.sock = sock

    return UnixHTTPConnection("localhost", timeout=timeout)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def post(path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
    """POST ``body`` to the agent's /cni; return (HTTP status, body). Raise AgentUnreachable."""
    conn = _connection(path, timeout)
    headers = {"Content-Type": "application/json", "Connection": "close"}
    try:
        conn.request("POST", AGENT_PATH, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    except Exception as exc:  # OSError, HTTPException, and http.client's odd ones (OverflowError)
        raise AgentUnreachable(_reason(exc)) from None
    finally:
        conn.close()


def is_cni_error(answer: bytes) -> bool:
    """Whether ``answer`` is a JSON object with an integer ``code``."""
    try:
        obj = json.loads(answer.decode("utf-8"), parse_constant=float)
    except (ValueError, RecursionError):
        return False
    code = obj.get("code") if isinstance(obj, dict) else None
    return isinstance(code, int) and not isinstance(code, bool)


def _error(req: validate.ValidRequest, code: int, msg: str, details: str) -> validate.CniError:
    err = validate.CniError(code, msg, details)
    err.cni_version = req.cni_version
    return err


def interpret(req: validate.ValidRequest, path: str, status: int, answer: bytes) -> bytes:
    """Turn the agent's HTTP answer into stdout bytes; raise CniError if it is not one."""
    if 200 <= status < 300:
        return answer
    if is_cni_error(answer):
        raise AgentError(answer)
    code = validate.ERR_NOT_AVAILABLE if req.command == "STATUS" else validate.ERR_BAD_AGENT_ANSWER
    details = f"HTTP {status}: {answer[:200].decode('utf-8', 'replace')}"
    raise _error(req, code, f"unexpected answer from podnet agent at {path}", details)


def forward(req: validate.ValidRequest, env: Mapping[str, str], data: bytes) -> bytes:
    """Send a validated request to the agent; return what to print on success."""
    path = socket_path(req.config, env)
    try:
        status, answer = post(path, request_body(env, data), timeout_for(req.command, env))
    except AgentUnreachable as exc:
        status_cmd = req.command == "STATUS"
        code = validate.ERR_NOT_AVAILABLE if status_cmd else validate.ERR_TRY_AGAIN_LATER
        raise _error(req, code, f"podnet agent not reachable at {path}", str(exc)) from None
    return interpret(req, path, status, answer)


def dump(obj: Mapping[str, Any]) -> bytes:
    """Encode a locally made answer the way both shims print it."""
    return (json.dumps(obj) + "\n").encode("utf-8")


def run(env: Mapping[str, str], data: bytes) -> tuple[int, bytes]:
    """Handle one invocation: return (exit status, stdout bytes). Raises nothing CNI."""
    try:
        req = validate.validate_request(env, data)
        if req.command == "VERSION":
            return 0, dump(validate.version_answer(req.config))
        return 0, forward(req, env, data)
    except AgentError as exc:
        return 1, exc.answer
    except validate.CniError as err:
        return 1, dump(err.to_dict())


def _skip_ssl_import() -> None:
    # http.client imports ssl only for HTTPS, which we never use; that import is ~10 ms of
    # a ~70 ms run. Done only in the shim's own process (main), never when imported.
    if "ssl" not in sys.modules and "http.client" not in sys.modules:
        sys.modules["ssl"] = None  # type: ignore[assignment]


def _read_stdin() -> bytes:
    return sys.stdin.buffer.read() if sys.stdin is not None else b""


def _crash_answer(code: int, msg: str, exc: BaseException) -> tuple[int, bytes]:
    err = validate.CniError(code, msg, f"{type(exc).__name__}: {exc}")
    return 1, dump(err.to_dict())


def main() -> int:
    """Entry point of the plugin executable; returns the exit status."""
    try:
        _skip_ssl_import()
        data = _read_stdin()
    except OSError as exc:
        status, out = _crash_answer(validate.ERR_IO_FAILURE, "failed to read stdin", exc)
    else:
        try:
            status, out = run(os.environ, data)
        except BaseException as exc:  # the runtime parses stdout: never a traceback
            status, out = _crash_answer(validate.ERR_INTERNAL, "internal error in podnet shim", exc)
    try:
        sys.stdout.buffer.write(out)
        sys.stdout.flush()
    except (OSError, ValueError, AttributeError):
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
