"""``podnet master``'s heap governor for real: a master process started with a short
freeze period freezes its heap and reports the collector's pauses in /metrics; with
``--gc-freeze-every 0`` it leaves the collector alone; a thaw period shorter than the
freeze period is refused before anything starts."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

from podnet.cluster.processes import MasterProcess
from podnet.store.etcd_process import EtcdProcess
from podnet.testing.api import client_for
from podnet.testing.e2e import wait_for
from podnet.testing.processes import launch_master


def _sample(metrics: str, name: str) -> float | None:
    """The value of ``name``, summed over its labels; None if it is not there."""
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(name + " ") or line.startswith(name + "{")
    ]
    return sum(values) if values else None


def test_a_master_freezes_its_heap_and_counts_pauses(etcd: EtcdProcess, tmp_path: Path) -> None:
    prefix = f"/heap-{uuid.uuid4().hex[:6]}/"
    master = launch_master(etcd, tmp_path / "m", prefix, "--gc-freeze-every", "0.3")
    try:
        with client_for(master.kubeconfig) as api:

            def frozen() -> float | None:
                value = _sample(api.get("/metrics").text, "podnet_gc_frozen_objects")
                return value if value else None

            assert wait_for(frozen, 30, "a freeze") > 1000
            text = api.get("/metrics").text
        assert (_sample(text, "podnet_gc_pause_seconds_count") or 0) >= 1
    finally:
        master.stop()


def test_freezing_can_be_turned_off(etcd: EtcdProcess, tmp_path: Path) -> None:
    prefix = f"/heap-{uuid.uuid4().hex[:6]}/"
    master = launch_master(etcd, tmp_path / "m", prefix, "--gc-freeze-every", "0")
    try:
        with client_for(master.kubeconfig) as api:
            text = api.get("/metrics").text
        assert "podnet_apiserver_requests" in text
        assert "podnet_gc_" not in text
    finally:
        master.stop()


def test_a_thaw_period_shorter_than_the_freeze_period_is_refused(
    etcd: EtcdProcess, tmp_path: Path
) -> None:
    master = MasterProcess(etcd.endpoint, tmp_path / "m", "/heap-bad/")
    command = [*master.command(), "--gc-freeze-every", "60", "--gc-thaw-every", "30"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--gc-thaw-every" in done.stderr and "shorter than --gc-freeze-every" in done.stderr
    assert not (tmp_path / "m").exists()  # refused before anything was made
