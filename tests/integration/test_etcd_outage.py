"""During an etcd outage the master answers 503 at once (issue 19, finding 11: every API
call, ``/readyz`` included, took 10-18 s to answer 503).

A real master on its own etcd; the etcd process is frozen (SIGSTOP: the connection stays
up and nothing answers, the worst case) or killed, by PID. ``/readyz`` and an API GET
must answer 503 from the master's health guard ("failing fast"), not from a call that
waited for its 10 s deadline. The timing itself is measured in
``bench/bench_etcd_outage.py`` (no test asserts on a clock); here the guard's probe is
checked to cut calls within well under a second.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from podnet.kubeconfig import load_client_config
from podnet.store import health
from podnet.store.etcd_process import EtcdProcess, start_etcd
from podnet.testing import tools
from podnet.testing.processes import MasterProcess, launch_master


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    """An etcd for this test alone (it is stopped under the master), removed after."""
    tools.require("etcd")
    process = start_etcd(tmp_path / "etcd")
    try:
        yield process
    finally:
        pid = process.pid
        if pid is not None:  # a frozen etcd is thawed first, so that it can stop
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        process.stop(remove_data=True)


def answer(master: MasterProcess, path: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body) of an admin GET of ``path``; ``timeout`` bounds the wait (a
    master still waiting on etcd's 10 s deadline does not answer within it)."""
    config = load_client_config(str(master.kubeconfig))
    assert config.ca_data is not None
    context = ssl.create_default_context(cadata=config.ca_data.decode())
    context.check_hostname = False
    request = urllib.request.Request(
        f"{master.server}{path}", headers={"Authorization": f"Bearer {config.token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_the_guard_cuts_calls_well_within_a_second() -> None:
    assert health.TIMEOUT + health.INTERVAL < 1.0


@pytest.mark.slow
@pytest.mark.parametrize("outage", [signal.SIGSTOP, signal.SIGKILL], ids=["frozen", "killed"])
def test_readyz_and_api_calls_answer_503_at_once_during_an_etcd_outage(
    own_etcd: EtcdProcess, tmp_path: Path, prefix: str, outage: signal.Signals
) -> None:
    master = launch_master(own_etcd, tmp_path / "master", prefix, "--no-controllers")
    try:
        assert answer(master, "/readyz")[0] == 200
        assert answer(master, "/api/v1/namespaces/default")[0] in (200, 404)
        assert own_etcd.pid is not None
        os.kill(own_etcd.pid, outage)
        for path in ("/readyz", "/api/v1/namespaces/default", "/readyz"):
            status, body = answer(master, path, timeout=5.0)
            assert status == 503, (path, status, body)
            assert "failing fast" in body, body  # the guard's answer, not a call's deadline
        if outage == signal.SIGSTOP:
            os.kill(own_etcd.pid, signal.SIGCONT)  # etcd answers again: so does the master
            status, body = answer(master, "/api/v1/namespaces/default", timeout=15.0)
            for _ in range(50):  # up to 10 s for the probe to find it back
                if status != 503:
                    break
                time.sleep(0.2)
                status, body = answer(master, "/api/v1/namespaces/default", timeout=15.0)
            assert status in (200, 404), body
    finally:
        master.stop()
