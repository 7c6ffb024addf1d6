"""The connectivity matrix: rendering (pure), pair enumeration and ping output parsing."""

from __future__ import annotations

import subprocess

import pytest

from podnet.cluster import matrix
from podnet.cluster.matrix import Endpoint, PairResult, Probe, render_matrix, summary

A = Endpoint("a", "node1", "10.128.0.2", "pn-x-p-a")
B = Endpoint("b", "node2", "10.128.2.2", "pn-x-p-b")
C = Endpoint("c", "node3", "10.128.4.2", "pn-x-p-c")
OK = Probe(True, 0.123)


def full_mesh(*pods: Endpoint, broken: tuple[str, str] | None = None) -> list[PairResult]:
    results = []
    for s in pods:
        for d in pods:
            if s is d:
                continue
            tcp = (
                Probe(False, error="timed out") if (s.name, d.name) == broken else Probe(True, 1.5)
            )
            results.append(PairResult(s.name, d.name, OK, tcp))
    return results


def test_every_cell_shows_both_probes_with_milliseconds() -> None:
    text = render_matrix([A, B], full_mesh(A, B))
    lines = text.splitlines()
    assert lines[0].split() == ["from", "\\", "to", "a", "b"]
    assert lines[1].startswith("a (node1 10.128.0.2)")
    assert "—" in lines[1] and "✓0.12 ✓1.50" in lines[1]
    assert lines[2].startswith("b (node2 10.128.2.2)")
    assert "2/2 pairs ok (ping 2/2, tcp 2/2)" in text
    assert "✗" not in text.split("each cell")[0]


def test_a_failed_probe_is_a_cross_and_is_listed_with_its_reason() -> None:
    text = render_matrix([A, B, C], full_mesh(A, B, C, broken=("b", "c")))
    row_b = next(line for line in text.splitlines() if line.startswith("b ("))
    assert "✓0.12 ✗" in row_b
    assert "5/6 pairs ok (ping 6/6, tcp 5/6)" in text
    assert "✗ b -> c: tcp timed out" in text


def test_columns_line_up() -> None:
    pods = [A, Endpoint("a-much-longer-name", "node2", "10.128.2.9", "ns")]
    lines = render_matrix(pods, full_mesh(*pods)).splitlines()[:3]
    starts = {line.index(cell) for line, cell in zip(lines[1:], ["—", "✓"], strict=True)}
    assert len(starts) == 1  # the first column starts at the same offset in every row
    assert all(line == line.rstrip() for line in lines)


def test_missing_results_render_as_dashes() -> None:
    text = render_matrix([A, B], [])
    assert "0/0 pairs ok" in text
    assert text.splitlines()[1].count("—") == 2


def test_summary_of_a_failed_ping() -> None:
    result = PairResult("a", "b", Probe(False, error="no reply"), Probe(True, 1.0))
    assert summary([result]) == "0/1 pairs ok (ping 0/1, tcp 1/1)\n  ✗ a -> b: ping no reply"


def test_run_matrix_probes_every_ordered_pair_once(monkeypatch: pytest.MonkeyPatch) -> None:
    pings: list[tuple[str, str]] = []
    tcps: list[tuple[str, str]] = []
    by_ip = {p.ip: p.name for p in (A, B, C)}

    def fake_ping(source: Endpoint, ip: str) -> Probe:
        pings.append((source.name, by_ip[ip]))
        return OK

    def fake_tcp(source: Endpoint, ip: str) -> Probe:
        tcps.append((source.name, by_ip[ip]))
        return Probe(False, error="refused") if ip == C.ip else OK

    monkeypatch.setattr(matrix, "ping_probe", fake_ping)
    monkeypatch.setattr(matrix, "tcp_probe", fake_tcp)
    results = matrix.run_matrix([A, B, C], workers=2)
    expected = [(s, d) for s in "abc" for d in "abc" if s != d]
    assert sorted(pings) == sorted(set(tcps)) == sorted(expected)
    # the pairs that answered are timed a second time, alone
    assert len(tcps) == len(expected) + sum(d != "c" for _, d in expected)
    assert [(r.source, r.destination) for r in results] == expected  # input order kept
    assert [r.ok for r in results] == [d != "c" for _, d in expected]


PING_OK = """PING 10.128.2.2 (10.128.2.2) 56(84) bytes of data.
64 bytes from 10.128.2.2: icmp_seq=1 ttl=63 time=0.087 ms

--- 10.128.2.2 ping statistics ---
1 packets transmitted, 1 received, 0% packet loss, time 0ms
"""
PING_LOST = """PING 10.128.2.2 (10.128.2.2) 56(84) bytes of data.

--- 10.128.2.2 ping statistics ---
1 packets transmitted, 0 received, 100% packet loss, time 0ms
"""


@pytest.mark.parametrize(
    ("stdout", "code", "expected"),
    [(PING_OK, 0, Probe(True, 0.087)), (PING_LOST, 1, Probe(False, error="no reply"))],
)
def test_ping_probe_reads_the_round_trip_time(
    monkeypatch: pytest.MonkeyPatch, stdout: str, code: int, expected: Probe
) -> None:
    calls: list[tuple[str, list[str]]] = []

    def fake_run(name: str, argv: list[str], timeout: float = 30.0) -> object:
        calls.append((name, argv))
        return subprocess.CompletedProcess(argv, code, stdout, "")

    monkeypatch.setattr(matrix.netns, "run", fake_run)
    assert matrix.ping_probe(A, "10.128.2.2") == expected
    assert calls == [("pn-x-p-a", ["ping", "-n", "-c", "1", "-W", "1", "10.128.2.2"])]
