"""Readiness of local-cluster pods without a cluster: the check, the state machine, the
conditions as written, and the prober's loop on fakes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from click.testing import CliRunner

from podnet.cli.main import cli
from podnet.cli.pod_cmd import readiness_check
from podnet.cluster import pods
from podnet.cluster.prober import probe_loop
from podnet.cluster.readiness import (
    ReadinessCheck,
    ReadinessError,
    ReadinessTracker,
    readiness_status,
    ready_conditions,
    rfc3339,
)
from podnet.cluster.state import ClusterState, PodRecord, ProcessRecord


def test_tracker_flips_after_the_thresholds() -> None:
    tracker = ReadinessTracker(successes=2, failures=3)
    assert not tracker.ready
    assert [tracker.observe(ok) for ok in (True, False, True, True)] == [False] * 3 + [True]
    assert tracker.ready
    # failures must come in a row: a success in between starts the count again
    assert [tracker.observe(ok) for ok in (False, False, True, False, False)] == [False] * 5
    assert tracker.ready
    assert tracker.observe(False) is True and not tracker.ready
    assert tracker.observe(False) is False


def test_tracker_stopped_is_not_ready_at_once() -> None:
    tracker = ReadinessTracker(successes=1, failures=5)
    assert tracker.observe(True) and tracker.ready
    assert tracker.stopped() is True and not tracker.ready
    assert tracker.stopped() is False


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({}, "exactly one"),
        ({"tcp_port": 80, "command": "true"}, "exactly one"),
        ({"tcp_port": 0}, "not in 1..65535"),
        ({"tcp_port": 70000}, "not in 1..65535"),
        ({"command": "  "}, "empty"),
        ({"tcp_port": 80, "period": 0.01}, "period"),
        ({"tcp_port": 80, "period": 1.0, "timeout": 2.0}, "timeout"),
        ({"tcp_port": 80, "failures": 0}, "failure threshold"),
        ({"tcp_port": 80, "successes": 101}, "success threshold"),
    ],
)
def test_malformed_checks_are_refused(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(ReadinessError, match=words):
        ReadinessCheck(**kwargs)  # type: ignore[arg-type]


def test_probe_spec_is_a_kubernetes_readiness_probe() -> None:
    tcp = ReadinessCheck(tcp_port=8080, period=0.2, timeout=0.2, failures=1)
    assert tcp.probe_spec() == {
        "tcpSocket": {"port": 8080},
        "periodSeconds": 1,
        "timeoutSeconds": 1,
        "successThreshold": 1,
        "failureThreshold": 1,
    }
    cmd = ReadinessCheck(command="test -f /tmp/ok", period=2.5, timeout=1.0)
    assert cmd.probe_spec()["exec"] == {"command": ["sh", "-c", "test -f /tmp/ok"]}
    assert cmd.probe_spec()["periodSeconds"] == 3
    record = PodRecord("web", "a", "node1", "pn-x-p-web", "c")
    container = pods.pod_object(record, pods.ECHO_COMMAND, (), tcp)["spec"]["containers"][0]
    assert container["readinessProbe"]["tcpSocket"] == {"port": 8080}
    assert (
        "readinessProbe" not in pods.pod_object(record, pods.ECHO_COMMAND)["spec"]["containers"][0]
    )


def test_conditions_keep_their_transition_time_and_other_types() -> None:
    t0, t1 = "2026-01-01T00:00:00Z", "2026-01-01T00:00:09Z"
    scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": "x"}
    first = ready_conditions(False, t0, [scheduled])
    assert first[0] == scheduled
    by_type = {c["type"]: c for c in first}
    assert by_type["Ready"]["status"] == "False"
    assert by_type["Ready"]["reason"] == "ContainersNotReady"
    assert by_type["ContainersReady"]["lastTransitionTime"] == t0
    same = {c["type"]: c for c in ready_conditions(False, t1, first)}
    assert same["Ready"]["lastTransitionTime"] == t0, "no transition, time kept"
    flipped = {c["type"]: c for c in ready_conditions(True, t1, first)}
    assert flipped["Ready"] == {
        "type": "Ready",
        "status": "True",
        "lastProbeTime": None,
        "lastTransitionTime": t1,
    }
    status = readiness_status(True, True, t1, {"conditions": first})
    assert status["containerStatuses"][0]["ready"] is True
    assert status["containerStatuses"][0]["state"] == {"running": {}}
    gone = readiness_status(False, False, t1)["containerStatuses"][0]
    assert gone["ready"] is False and "terminated" in gone["state"]


def test_rfc3339_is_utc_whole_seconds() -> None:
    moment = datetime(2026, 1, 2, 3, 4, 5, 678, tzinfo=timezone(timedelta(hours=2)))
    assert rfc3339(moment) == "2026-01-02T01:04:05Z"
    assert rfc3339(datetime(2026, 1, 2, tzinfo=UTC)).endswith("T00:00:00Z")


def test_probe_loop_reports_start_flips_retries_and_the_end() -> None:
    results = iter([False, True, True, False, False, False])
    lives = iter([True] * 6 + [False])
    answers = iter([True, True, False, True, True, True, True])  # the 3rd write fails
    reports: list[tuple[bool, bool]] = []
    sleeps: list[float] = []

    def report(ready: bool, running: bool) -> bool:
        reports.append((ready, running))
        return next(answers)

    check = ReadinessCheck(tcp_port=80, period=0.5, timeout=0.5, failures=2)
    probe_loop(check, lambda: next(results), lambda: next(lives), report, sleeps.append)
    assert reports == [
        (False, True),  # at start: not ready
        (True, True),  # the first success (threshold 1)
        (False, True),  # two failures in a row -- this write fails...
        (False, True),  # ...so it is written again after the next probe
        (False, False),  # the process is gone
    ]
    assert len(sleeps) == 6 and all(0 <= s <= 0.5 for s in sleeps)


def test_cli_readiness_options() -> None:
    assert readiness_check(None, None, 1.0, 3) is None
    check = readiness_check(8080, None, 0.2, 1)
    assert check is not None and check.tcp_port == 8080 and check.timeout == 0.2
    runner = CliRunner()
    both = runner.invoke(cli, ["pod", "run", "web", "--ready-tcp", "80", "--ready-cmd", "true"])
    assert both.exit_code != 0 and "not both" in both.output
    bad = runner.invoke(cli, ["pod", "run", "web", "--ready-tcp", "0"])
    assert bad.exit_code != 0 and "not in 1..65535" in bad.output


def test_prober_command_runs_in_the_node_namespace_with_the_node_identity(
    tmp_path: object,
) -> None:
    from pathlib import Path

    from podnet.cluster.nodes import new_node_record
    from podnet.cluster.podready import prober_command, prober_needle

    state_dir = Path(str(tmp_path))
    state = ClusterState(cluster_id="abc123", underlay_cidr="192.168.100.0/24")
    state.nodes["node1"] = new_node_record(state, 1)
    pod = PodRecord("web", "a", "node1", "pn-abc123-p-1", "c", ip="10.128.0.5")
    pod.process = ProcessRecord(4242, "podnet.cluster.echo", 99)
    check = ReadinessCheck(command="test -f /ok", period=0.5, timeout=0.5)
    argv = prober_command(state, state_dir, pod, check)
    assert argv[:3] == ["nsenter", "--net=/run/netns/pn-abc123-node1", "--"]
    line = " ".join(argv)
    assert f"--kubeconfig {state_dir}/nodes/node1/node.kubeconfig" in line
    assert "--pod-pid 4242 --pod-start 99" in line and prober_needle(pod) in line
    exec_json = argv[argv.index("--exec-json") + 1]
    assert '"exec", "--pid", "4242", "--start", "99"' in exec_json
    assert '"test -f /ok"' in exec_json, "the exec check runs in the running pod's sandbox"


def test_the_ready_column_follows_the_reported_readiness() -> None:
    from podnet.model.kinds import POD

    ready = next(c for c in POD.columns if c.name == "READY")
    running = {"status": {"phase": "Running"}}
    assert ready.read(running) == "1/1", "no readiness written: running is ready"
    assert ready.read({"status": {"phase": "Pending"}}) == "0/1"
    not_ready = {"status": {"phase": "Running", **readiness_status(False, True, "t")}}
    assert ready.read(not_ready) == "0/1"
    assert ready.read({"status": readiness_status(True, True, "t")}) == "1/1"


class FakeStatusApi:
    """GET and PATCH of one Pod's status; NotFound once ``deleted``."""

    def __init__(self) -> None:
        self.status: dict[str, Any] = {"phase": "Running"}
        self.deleted = False
        self.patches: list[dict[str, Any]] = []

    def get(self, kind: Any, namespace: str | None, name: str) -> dict[str, Any]:
        from podnet.client import NotFound

        if self.deleted:
            raise NotFound("pods not found", 404, "NotFound")
        return {"metadata": {"name": name}, "status": self.status}

    def patch(self, kind: Any, namespace: str | None, name: str, patch: dict[str, Any], *,
              subresource: str = "") -> dict[str, Any]:  # fmt: skip
        assert (kind.plural, subresource) == ("pods", "status")
        self.patches.append(patch)
        self.status = {**self.status, **patch["status"]}
        return {}


def test_reporter_writes_status_and_notices_a_deleted_pod() -> None:
    from podnet.cluster.prober import PodStatusReporter

    api = FakeStatusApi()
    reporter = PodStatusReporter(api, "a", "web")
    assert reporter.write(False, True) and reporter.write(True, True)
    ready = {c["type"]: c["status"] for c in api.status["conditions"]}
    assert ready == {"ContainersReady": "True", "Ready": "True"}
    assert api.status["phase"] == "Running", "only the readiness part is patched"
    api.deleted = True
    assert reporter.write(False, True) is False and reporter.gone


def test_describe_pod_shows_its_conditions_as_kubectl() -> None:
    from podnet.cli import output
    from podnet.model.kinds import POD

    status = {"phase": "Running", **readiness_status(False, True, "2026-01-01T00:00:00Z")}
    lines = output.describe(POD, {"metadata": {"name": "web"}, "status": status}).splitlines()
    at = lines.index("Conditions:")
    assert [line.split() for line in lines[at + 1 : at + 5]] == [
        ["Type", "Status"],
        ["----", "------"],
        ["ContainersReady", "False"],
        ["Ready", "False"],
    ]
    assert not any(line.strip().startswith("- Type:") for line in lines)


def test_pod_run_passes_the_check_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    def fake_run_pod(
        *args: Any, privileged: bool = False, readiness: Any = None, **_: Any
    ) -> PodRecord:
        seen.append(readiness)
        return PodRecord(args[1], args[2], "node1", "pn-x-p-web", "c", ip="10.128.0.5")

    monkeypatch.setattr(pods, "run_pod", fake_run_pod)
    runner = CliRunner()
    args = ["pod", "run", "web", "--ready-cmd", "test -f /x", "--ready-period", "0.5"]
    done = runner.invoke(cli, [*args, "--ready-failures", "2"])
    assert done.exit_code == 0, done.output
    assert seen[0] == ReadinessCheck(command="test -f /x", period=0.5, timeout=0.5, failures=2)
    assert "ready check exec 'test -f /x' every 0.5s" in done.output
    plain = runner.invoke(cli, ["pod", "run", "web"])
    assert plain.exit_code == 0 and seen[1] is None and "ready check" not in plain.output
