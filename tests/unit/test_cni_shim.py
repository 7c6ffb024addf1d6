"""The CNI shims (Python and C) run as real processes against a fake agent."""

from __future__ import annotations

import json
import os
import shutil
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import podnet.cni
from podnet.cni import build, shim
from podnet.testing import tools

CNI_DIR = Path(podnet.cni.__file__).resolve().parent
SHIM_PY = CNI_DIR / "shim.py"
CONFIG = '{"cniVersion": "1.0.0", "name": "podnet", "type": "podnet", "note": "ünïcode"}'
ADD_ENV = {
    "CNI_COMMAND": "ADD",
    "CNI_CONTAINERID": "c0ffee-1.2_3",
    "CNI_NETNS": "/var/run/netns/pod-a",
    "CNI_IFNAME": "eth0",
    "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=a;K8S_POD_NAME=b",
    "CNI_PATH": "/opt/cni/bin:/usr/lib/cni",
}


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeAgent:
    """An HTTP server on a unix socket that records requests and gives a canned answer."""

    socket_path: str
    status: int = 200
    body: bytes = b""
    mode: str = "answer"  # answer | chunked | close | hang
    requests: list[Recorded] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    hang_ended: bool = False  # a "hang" ran out (10 s) without release: then it hung up

    def answer(self, status: int, body: bytes | dict[str, Any], mode: str = "answer") -> None:
        self.status = status
        self.body = json.dumps(body).encode() if isinstance(body, dict) else body
        self.mode = mode

    def request_json(self) -> Any:
        assert len(self.requests) == 1
        return json.loads(self.requests[0].body)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        agent = self.server.agent
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        agent.requests.append(Recorded(self.command, self.path, dict(self.headers), body))
        if agent.mode == "hang":
            agent.hang_ended = not agent.release.wait(10)
        if agent.mode in ("hang", "close"):
            self.close_connection = True
            return
        self.send_response(agent.status)
        self.send_header("Content-Type", "application/json")
        if agent.mode == "chunked":
            self._send_chunked(agent.body)
            return
        self.send_header("Content-Length", str(len(agent.body)))
        self.end_headers()
        if agent.body:  # the shim may hang up as soon as it has read Content-Length: 0
            self.wfile.write(agent.body)

    def _send_chunked(self, body: bytes) -> None:
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for start in range(0, len(body), 7):
            part = body[start : start + 7]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    agent: FakeAgent


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # sun_path holds 108 bytes: pytest's tmp_path can be longer than that.
    path = Path(tempfile.mkdtemp(prefix="pncni"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def agent(sock_dir: Path) -> Iterator[FakeAgent]:
    fake = FakeAgent(str(sock_dir / "agent.sock"))
    server = _Server(fake.socket_path, _Handler)
    server.agent = fake
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield fake
    fake.release.set()
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture(scope="session")
def c_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C shim, built with gcc (required: a missing gcc fails these tests)."""
    tools.require("gcc")
    out = tmp_path_factory.mktemp("cshim") / "podnet"
    assert build.build_c_shim(out), "gcc is installed but the C shim did not build"
    return out


@pytest.fixture(scope="session")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build.install_shim(tmp_path_factory.mktemp("bin"), sys.executable, prefer_c=False)


@pytest.fixture(params=["python", "launcher", "c"])
def shim_cmd(request: pytest.FixtureRequest, c_binary: Path) -> list[str]:
    if request.param == "python":
        return [sys.executable, "-I", "-S", str(SHIM_PY)]
    if request.param == "launcher":
        return [str(request.getfixturevalue("launcher"))]
    return [str(c_binary)]


@dataclass
class Outcome:
    status: int
    stdout: bytes
    stderr: bytes

    def error(self) -> dict[str, Any]:
        """The CNI error printed on stdout, checked for shape and exit status."""
        assert self.status == 1, self
        assert self.stderr == b"", self.stderr
        err = json.loads(self.stdout)
        assert set(err) == {"cniVersion", "code", "msg", "details"}, err
        assert isinstance(err["code"], int) and isinstance(err["msg"], str)
        return err


def run_shim(cmd: list[str], env: dict[str, str], stdin: bytes | str) -> Outcome:
    data = stdin.encode() if isinstance(stdin, str) else stdin
    proc = subprocess.run(cmd, input=data, env=env, capture_output=True, timeout=30)
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


def cni_env(agent_or_path: FakeAgent | str, **overrides: str) -> dict[str, str]:
    path = agent_or_path if isinstance(agent_or_path, str) else agent_or_path.socket_path
    env = {**ADD_ENV, "PODNET_CNI_SOCKET": path, "NOT_CNI": "x", **overrides}
    return {k: v for k, v in env.items() if v != "<unset>"}


# ---- VERSION and the agent protocol ----


def test_version_needs_no_agent(shim_cmd: list[str]) -> None:
    env = {"CNI_COMMAND": "VERSION", "PODNET_CNI_SOCKET": "/nonexistent/agent.sock"}
    out = run_shim(shim_cmd, env, '{"cniVersion": "0.4.0"}')
    assert (out.status, out.stderr) == (0, b"")
    assert json.loads(out.stdout) == {
        "cniVersion": "0.4.0",
        "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"],
    }
    assert json.loads(run_shim(shim_cmd, env, b"").stdout)["cniVersion"] == "1.1.0"


def test_add_forwards_env_and_config_intact(shim_cmd: list[str], agent: FakeAgent) -> None:
    result = {"cniVersion": "1.0.0", "ips": [{"address": "10.128.0.5/23"}], "dns": {}}
    agent.answer(200, result)
    out = run_shim(shim_cmd, cni_env(agent), CONFIG)
    assert (out.status, out.stdout, out.stderr) == (0, agent.body, b"")
    (req,) = agent.requests
    assert (req.method, req.path) == ("POST", "/cni")
    assert req.headers["Content-Type"] == "application/json"
    assert agent.request_json() == {"env": ADD_ENV, "config": CONFIG}


@pytest.mark.parametrize("command", ["DEL", "CHECK", "GC", "STATUS"])
def test_other_commands_are_forwarded(shim_cmd: list[str], agent: FakeAgent, command: str) -> None:
    config = CONFIG.replace("1.0.0", "1.1.0")
    out = run_shim(shim_cmd, cni_env(agent, CNI_COMMAND=command), config)
    assert (out.status, out.stdout, out.stderr) == (0, b"", b"")
    assert agent.request_json()["env"]["CNI_COMMAND"] == command


def test_del_without_netns_is_forwarded(shim_cmd: list[str], agent: FakeAgent) -> None:
    out = run_shim(shim_cmd, cni_env(agent, CNI_COMMAND="DEL", CNI_NETNS=""), CONFIG)
    assert out.status == 0
    assert agent.request_json()["env"]["CNI_NETNS"] == ""


def test_agent_error_is_passed_through(shim_cmd: list[str], agent: FakeAgent) -> None:
    error = {"cniVersion": "1.0.0", "code": 3, "msg": "unknown container", "details": "c0ffee"}
    agent.answer(404, error)
    out = run_shim(shim_cmd, cni_env(agent), CONFIG)
    assert out.error() == error
    assert out.stdout == agent.body


def test_chunked_answer(shim_cmd: list[str], agent: FakeAgent) -> None:
    agent.answer(200, {"cniVersion": "1.0.0", "dns": {"nameservers": ["10.0.0.10"]}}, "chunked")
    out = run_shim(shim_cmd, cni_env(agent), CONFIG)
    assert (out.status, out.stdout) == (0, agent.body)


@pytest.mark.parametrize(("command", "code"), [("ADD", 100), ("STATUS", 50)])
def test_agent_answer_that_is_not_cni(
    shim_cmd: list[str], agent: FakeAgent, command: str, code: int
) -> None:
    agent.answer(500, b"500 Internal Server Error")
    config = CONFIG.replace("1.0.0", "1.1.0")
    err = run_shim(shim_cmd, cni_env(agent, CNI_COMMAND=command), config).error()
    assert err["code"] == code
    assert agent.socket_path in err["msg"] and "HTTP 500" in err["details"]


# ---- agent not reachable ----


@pytest.mark.parametrize(
    ("command", "code"), [("ADD", 11), ("CHECK", 11), ("GC", 11), ("DEL", 11), ("STATUS", 50)]
)
def test_agent_down(shim_cmd: list[str], sock_dir: Path, command: str, code: int) -> None:
    path = str(sock_dir / "missing.sock")
    config = CONFIG.replace("1.0.0", "1.1.0")
    err = run_shim(shim_cmd, cni_env(path, CNI_COMMAND=command), config).error()
    assert (err["code"], err["cniVersion"]) == (code, "1.1.0")
    assert path in err["msg"]


def test_agent_refuses(shim_cmd: list[str], sock_dir: Path) -> None:
    path = str(sock_dir / "stale.sock")
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(path)  # bound, never listening: connect() is refused
        err = run_shim(shim_cmd, cni_env(path), CONFIG).error()
    assert err["code"] == 11 and "refused" in err["details"].lower()


def test_agent_closes_without_answer(shim_cmd: list[str], agent: FakeAgent) -> None:
    agent.answer(200, b"", "close")
    assert run_shim(shim_cmd, cni_env(agent), CONFIG).error()["code"] == 11


def test_agent_timeout(shim_cmd: list[str], agent: FakeAgent) -> None:
    agent.answer(200, b"", "hang")
    err = run_shim(shim_cmd, cni_env(agent, PODNET_CNI_TIMEOUT="0.5"), CONFIG).error()
    assert err["code"] == 11 and "timed out" in err["details"]
    # The shim gave up on its own clock while the agent still held the request (not the
    # 60 s ADD default, which would outlast the agent's hang and see it hang up instead).
    assert len(agent.requests) == 1 and not agent.hang_ended


def test_config_socket_path_wins(shim_cmd: list[str], agent: FakeAgent) -> None:
    config = json.dumps({**json.loads(CONFIG), "socketPath": agent.socket_path})
    out = run_shim(shim_cmd, cni_env("/nonexistent/agent.sock"), config)
    assert out.status == 0 and len(agent.requests) == 1


# ---- local checks ----

LOCAL_ERRORS = [
    ("malformed JSON", {}, '{"cniVersion": "1.0.0",', 6),
    ("not an object", {}, '["podnet"]', 6),
    ("empty stdin", {}, "", 6),
    ("invalid UTF-8", {}, b'{"name": "\xff"}', 6),
    ("NaN", {}, '{"cniVersion": "1.0.0", "name": "n", "type": "t", "mtu": NaN}', 6),
    ("missing name", {}, '{"cniVersion": "1.0.0", "type": "podnet"}', 7),
    ("missing type", {}, '{"cniVersion": "1.0.0", "name": "n"}', 7),
    ("name not a string", {}, '{"cniVersion": "1.0.0", "name": 1, "type": "t"}', 7),
    ("unsupported version", {}, '{"cniVersion": "0.2.0", "name": "n", "type": "t"}', 1),
    ("no version", {}, '{"name": "n", "type": "t"}', 1),
    ("CHECK before 0.4.0", {"CNI_COMMAND": "CHECK"}, CONFIG.replace("1.0.0", "0.3.1"), 1),
    ("GC before 1.1.0", {"CNI_COMMAND": "GC"}, CONFIG, 1),
    ("no command", {"CNI_COMMAND": "<unset>"}, CONFIG, 4),
    ("unknown command", {"CNI_COMMAND": "FROB"}, CONFIG, 4),
    ("no container id", {"CNI_CONTAINERID": "<unset>"}, CONFIG, 4),
    ("bad container id", {"CNI_CONTAINERID": "-abc"}, CONFIG, 4),
    ("container id with /", {"CNI_CONTAINERID": "a/b"}, CONFIG, 4),
    ("no ifname", {"CNI_IFNAME": ""}, CONFIG, 4),
    ("ifname of 16 bytes", {"CNI_IFNAME": "e" * 16}, CONFIG, 4),
    ("ifname of 16 UTF-8 bytes", {"CNI_IFNAME": "é" * 8}, CONFIG, 4),
    ("ifname with /", {"CNI_IFNAME": "eth/0"}, CONFIG, 4),
    ("ifname with :", {"CNI_IFNAME": "eth:0"}, CONFIG, 4),
    ("ifname with a space", {"CNI_IFNAME": "eth 0"}, CONFIG, 4),
    ("ifname with nbsp", {"CNI_IFNAME": "eth\u00a00"}, CONFIG, 4),
    ("ifname ..", {"CNI_IFNAME": ".."}, CONFIG, 4),
    ("ADD without netns", {"CNI_NETNS": "<unset>"}, CONFIG, 4),
]


@pytest.mark.parametrize(
    ("env", "stdin", "code"), [case[1:] for case in LOCAL_ERRORS], ids=[c[0] for c in LOCAL_ERRORS]
)
def test_local_errors(
    shim_cmd: list[str], agent: FakeAgent, env: dict[str, str], stdin: str | bytes, code: int
) -> None:
    err = run_shim(shim_cmd, cni_env(agent, **env), stdin).error()
    assert err["code"] == code, err
    assert agent.requests == []


def test_error_reported_in_config_version(shim_cmd: list[str], agent: FakeAgent) -> None:
    err = run_shim(shim_cmd, cni_env(agent, CNI_IFNAME=""), CONFIG.replace("1.0.0", "0.4.0"))
    assert err.error()["cniVersion"] == "0.4.0"


# ---- the C shim behaves as the Python one ----

_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20
)
_ifname = st.one_of(
    _text, st.sampled_from(["eth0", "..", "a:b", "a\u2028b", "a\x1cb", "x" * 15, "x" * 16])
)
_version = st.one_of(
    st.sampled_from(["0.3.1", "0.4.0", "1.0.0", "1.1.0", "", "0.2.0"]), st.integers()
)
_config = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={"cniVersion": _version, "name": _text, "type": _text, "ipam": st.just({})},
    ).map(json.dumps),
    _text,
)


@settings(max_examples=150, deadline=None)
@given(
    command=st.sampled_from(["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION", "", "add"]),
    container_id=_text,
    ifname=_ifname,
    netns=st.sampled_from(["", "/run/netns/x"]),
    config=_config,
)
def test_c_matches_python(
    c_binary: Path, command: str, container_id: str, ifname: str, netns: str, config: str
) -> None:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_IFNAME": ifname}
    env |= {"CNI_NETNS": netns, "PODNET_CNI_SOCKET": "/nonexistent/podnet/agent.sock"}
    env = {k: v for k, v in env.items() if v}
    py_status, py_out = shim.run(env, config.encode())
    c = run_shim([str(c_binary)], env, config)
    assert c.status == py_status
    py_answer, c_answer = json.loads(py_out), json.loads(c.stdout)
    if py_answer.get("code") == 6:  # the decoder's own words differ
        py_answer.pop("details"), c_answer.pop("details")
    assert c_answer == py_answer


# ---- install and start-up time ----


def test_launcher_shebang_names_the_real_interpreter(launcher: Path) -> None:
    first = launcher.read_text().splitlines()[0]
    assert first == f"#!{os.path.realpath(sys.executable)} -IS"
    assert "/usr/bin/env" not in first


def test_build_without_compiler(tmp_path: Path) -> None:
    assert not build.build_c_shim(tmp_path / "podnet", compiler="no-such-cc-podnet")
    assert not (tmp_path / "podnet").exists()


def test_install_prefers_c(tmp_path: Path, c_binary: Path) -> None:
    installed = build.install_shim(tmp_path, sys.executable)
    assert installed == tmp_path / "podnet"
    assert installed.read_bytes()[:4] == b"\x7fELF"


# The shims' start-up time (the C shim faster than Python) is measured, not asserted:
# bench/bench_latencies.py --only shim.


def test_python_shim_imports_only_what_it_needs(sock_dir: Path) -> None:
    env = {**ADD_ENV, "PODNET_CNI_SOCKET": str(sock_dir / "missing.sock")}
    cmd = [sys.executable, "-I", "-S", "-X", "importtime", str(SHIM_PY)]
    proc = subprocess.run(cmd, input=CONFIG.encode(), env=env, capture_output=True, timeout=30)
    assert json.loads(proc.stdout)["code"] == 11
    modules = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.decode().splitlines()}
    assert "validate" in modules and "http.client" in modules
    assert not {m for m in modules if m.startswith("podnet")}
    # ssl is skipped (never loaded: only the None placeholder is "imported").
    assert not modules & {"_ssl", "typing", "dataclasses"}


def test_the_c_shim_is_compiled_once_per_source_and_taken_from_a_private_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled: list[Path] = []
    real = build._compile

    def counting(cc: str, out: Path) -> bool:
        compiled.append(out)
        return real(cc, out)

    monkeypatch.setattr(build, "_compile", counting)
    cache = tmp_path / "cache"
    first, second = tmp_path / "a" / "podnet", tmp_path / "b" / "podnet"
    assert build.build_c_shim(first, cache=cache) and build.build_c_shim(second, cache=cache)
    assert len(compiled) == 1 and first.read_bytes() == second.read_bytes()
    assert cache.stat().st_mode & 0o777 == 0o700
    assert os.access(second, os.X_OK)
    cache.chmod(0o777)  # a cache others may write is never used: compiled again
    assert build.build_c_shim(tmp_path / "c" / "podnet", cache=cache)
    assert len(compiled) == 2
