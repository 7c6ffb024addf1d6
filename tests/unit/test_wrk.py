"""``podnet.testing.wrk``: every error class read from wrk's output (as wrk 4.1 prints it)."""

from __future__ import annotations

import pytest

from podnet.testing import wrk

CLEAN = """\
Running 3s test @ http://web.apps.podnet.test/
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    45.95ms    4.55ms  61.47ms   86.31%
    Req/Sec   346.77     33.87   414.00     76.67%
  Latency Distribution
     50%   44.90ms
     75%   47.95ms
     90%   51.21ms
     99%   59.65ms
  1037 requests in 3.01s, 477.99KB read
Requests/sec:    344.83
Transfer/sec:    158.94KB
"""

ERRORS = """\
Running 3s test @ http://web.apps.podnet.test/
  1 threads and 16 connections
  Latency Distribution
     50%   29.69ms
     75%   50.25ms
     90%   61.80ms
     99%  110.41ms
  844 requests in 3.05s, 335.78KB read
  Socket errors: connect 1, read 425, write 2, timeout 3
  Non-2xx or 3xx responses: 205
Requests/sec:    276.90
"""


def test_a_clean_run_has_every_class_at_zero() -> None:
    run = wrk.parse(CLEAN)
    assert (run.requests, run.rate, run.p99_ms) == (1037, 344.83, 59.65)
    assert run.errors == {"connect": 0, "read": 0, "write": 0, "timeout": 0, "non-2xx/3xx": 0}


def test_every_error_class_is_read() -> None:
    run = wrk.parse(ERRORS)
    assert run.errors == {"connect": 1, "read": 425, "write": 2, "timeout": 3, "non-2xx/3xx": 205}
    assert run.p99_ms == 110.41


def test_p99_in_microseconds_and_seconds() -> None:
    assert wrk.parse(CLEAN.replace("59.65ms", "900.00us")).p99_ms == pytest.approx(0.9)
    assert wrk.parse(CLEAN.replace("59.65ms", "1.50s")).p99_ms == 1500.0


def test_output_without_its_figures_is_refused() -> None:
    with pytest.raises(wrk.WrkOutputError, match="unexpected wrk output"):
        wrk.parse("unable to connect to web.apps.podnet.test:80 Connection refused\n")


def test_the_command_keeps_connections_and_asks_for_latencies() -> None:
    argv = wrk.command("http://x/", 3, 16)
    assert argv == ["wrk", "-t1", "-c16", "-d3s", "--latency", "http://x/"]
