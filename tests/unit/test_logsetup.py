"""The daemons' logging: the text and JSON formatters (no forged line from a logged value)
and the --log-level / --log-format flags of every daemon."""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from podnet import logsetup
from podnet.cli import master_cmd, node_cmd
from podnet.cli.main import CliState, cli
from podnet.cluster import relay

EVIL = "pod\n2026-01-01 00:00:00,000 ERROR podnet.master: forged\r\x1b[2J\x1b]0;t\x07\x7f\x9b\u2028"
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def record(message: str, *args: Any, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError(f"bad name {EVIL}")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord("podnet.test", logging.ERROR, __file__, 1, message, args, exc_info)


def assert_printable(line: str) -> None:
    assert all(" " <= c < "\x7f" for c in line), repr(line)


def test_json_format_is_one_ascii_object_per_record() -> None:
    line = logsetup.JsonFormatter().format(record("created %s", EVIL, exc=True))
    assert "\n" not in line
    assert_printable(line)
    entry = json.loads(line)
    assert set(entry) == {"time", "level", "logger", "message", "exception"}
    assert RFC3339.match(entry["time"]), entry["time"]
    assert (entry["level"], entry["logger"]) == ("error", "podnet.test")
    assert entry["message"] == f"created {EVIL}"  # the value is kept, only escaped
    assert entry["exception"].startswith("Traceback") and EVIL in entry["exception"]
    assert "exception" not in json.loads(logsetup.JsonFormatter().format(record("plain")))


def test_text_format_escapes_control_characters() -> None:
    text = logsetup.TextFormatter().format(record("created %s", EVIL))
    assert "\n" not in text
    assert_printable(text)
    assert text.endswith(r"ERROR podnet.test: created pod\n2026-01-01 00:00:00,000 ERROR "
                         r"podnet.master: forged\r\x1b[2J\x1b]0;t\x07\x7f\x9b\u2028")  # fmt: skip


def test_text_traceback_lines_cannot_pass_for_records() -> None:
    text = logsetup.TextFormatter().format(record("failed", exc=True))
    first, *rest = text.split("\n")
    assert first.endswith("ERROR podnet.test: failed")
    assert rest and rest[0] == "  Traceback (most recent call last):"
    for line in rest:
        assert line.startswith("  "), line
        assert_printable(line)
    assert "  ValueError: bad name pod" in rest  # its message's lines: indented, escaped
    assert "  2026-01-01 00:00:00,000 ERROR podnet.master: forged" in rest


def test_escape_controls_leaves_plain_text_alone() -> None:
    assert logsetup.escape_controls("ns/name é ü 中") == "ns/name é ü 中"
    assert logsetup.escape_controls("a\tb\x00") == r"a\tb\x00"


@pytest.fixture
def root_logging() -> Iterator[None]:
    """The root logger as a daemon starts with it: no handler (pytest's own, added for
    each phase, make ``configure`` leave it alone, as ``logging.basicConfig`` does); ours
    removed and the level restored after."""
    root = logging.getLogger()
    level = root.level
    yield
    for handler in ours():
        root.removeHandler(handler)
    root.setLevel(level)


def bare() -> None:
    """Take pytest's handlers (of this phase) off the root logger."""
    logging.getLogger().handlers[:] = []


def ours() -> list[logging.Handler]:
    return [h for h in logging.getLogger().handlers if isinstance(h, logsetup.StderrHandler)]


@pytest.mark.usefixtures("root_logging")
def test_configure_replaces_its_handler_and_sets_the_level(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bare()
    logsetup.configure("warning", "json")
    logsetup.configure("error", "json")
    assert len(ours()) == 1 and logging.getLogger().level == logging.ERROR
    logging.getLogger("podnet.x").warning("not shown")
    logging.getLogger("podnet.x").error("shown %s", "\n")
    lines = capsys.readouterr().err.splitlines()
    assert [json.loads(line)["message"] for line in lines] == ["shown \n"]
    with pytest.raises(ValueError, match="log level"):
        logsetup.configure("verbose", "text")
    foreign = logging.NullHandler()
    logging.getLogger().addHandler(foreign)  # someone else's logging: left alone
    assert logsetup.configure("debug", "text") is None
    assert logging.getLogger().level == logging.ERROR and foreign in logging.getLogger().handlers
    with pytest.raises(ValueError, match="log format"):
        logsetup.configure("info", "xml")


# ---- the flags, on every daemon --------------------------------------------------------

DAEMONS = ["master", "node", "controllers", "router"]


@pytest.mark.parametrize("command", DAEMONS)
@pytest.mark.parametrize(("flag", "value"), [("--log-level", "verbose"), ("--log-format", "xml")])
def test_every_daemon_refuses_bad_log_flags(command: str, flag: str, value: str) -> None:
    result = CliRunner().invoke(cli, [command, flag, value], obj=CliState())
    assert result.exit_code == 1, result.output
    assert f"Invalid value for '{flag}': '{value}' is not one of" in result.output


@pytest.mark.parametrize("command", DAEMONS)
def test_every_daemon_documents_the_log_flags(command: str) -> None:
    usage = CliRunner().invoke(cli, [command, "--help"], obj=CliState()).output
    assert "--log-level [debug|info|warning|error]" in usage
    assert "--log-format [text|json]" in usage


def test_relay_takes_and_checks_the_log_flags(
    monkeypatch: pytest.MonkeyPatch, root_logging: None
) -> None:
    bare()

    async def relays(*args: Any) -> None:
        pass

    monkeypatch.setattr(relay, "relay", relays)
    assert relay.main(["--port", "6443", "--log-level", "error", "--log-format", "json"]) == 0
    assert isinstance(ours()[0].formatter, logsetup.JsonFormatter)
    assert logging.getLogger().level == logging.ERROR
    with pytest.raises(SystemExit):
        relay.main(["--port", "6443", "--log-level", "verbose"])


@pytest.mark.usefixtures("root_logging")
def test_master_logs_as_its_flags_say(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bare()
    started: list[Any] = []

    async def runs(service: Any, logger: str) -> None:
        started.append(service.options)

    monkeypatch.setattr(master_cmd, "run_until_signalled", runs)
    argv = [
        "master",
        "--state-dir",
        str(tmp_path),
        "--log-level",
        "WARNING",
        "--log-format",
        "json",
    ]
    result = CliRunner().invoke(cli, argv, obj=CliState())
    assert result.exit_code == 0 and started, result.output
    assert isinstance(ours()[0].formatter, logsetup.JsonFormatter)
    assert logging.getLogger().level == logging.WARNING


@pytest.mark.usefixtures("root_logging")
def test_node_takes_error_and_json(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bare()
    started: list[Any] = []

    async def runs(config: Any, dataplane: str) -> None:
        started.append(config)

    monkeypatch.setattr(node_cmd, "_run", runs)
    argv = ["node", "--node-ip", "192.0.2.1", "--state-dir", str(tmp_path)]
    result = CliRunner().invoke(cli, [*argv, "--log-level", "error", "--log-format", "json"])
    assert result.exit_code == 0 and started, result.output
    assert isinstance(ours()[0].formatter, logsetup.JsonFormatter)
    assert logging.getLogger().level == logging.ERROR
    CliRunner().invoke(cli, argv)  # the defaults: info, text
    assert isinstance(ours()[0].formatter, logsetup.TextFormatter)
    assert logging.getLogger().level == logging.INFO
