"""How podnet's daemons log: to stderr, as text or as one JSON object per line.

Every daemon (``podnet master``, ``node``, ``controllers``, ``router`` and the API relay)
takes ``--log-level debug|info|warning|error`` and ``--log-format text|json`` and calls
``configure`` once. Neither format lets a logged value forge a line: the text format
escapes control characters in messages (``\\n``, ``\\r``, ``\\x1b``...) as ``repr`` does
and indents every line of a traceback; the JSON format is one ASCII-only object per line
(``time`` in RFC 3339 UTC, ``level``, ``logger``, ``message``, and ``exception`` when
there is one). The standard library's logging, and orjson for speed.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# C0 controls, DEL, C1 controls (U+009B is a CSI on some terminals) and the Unicode
# line and paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` with every control character written as its escape (``\\n``, ``\\x1b``)."""
    return _CONTROL.sub(_escape_one, text) if _CONTROL.search(text) else text


def to_json_line(obj: dict[str, Any]) -> str:
    """``obj`` as one line of printable ASCII. JSON escapes every control character below
    0x20; non-ASCII (U+2028, C1 controls such as U+009B) and DEL, which JSON may leave
    raw, are escaped too (``ensure_ascii``)."""
    try:
        raw = orjson.dumps(obj, default=str)  # the common case, all ASCII: fast
    except orjson.JSONEncodeError:  # a lone surrogate, say: json escapes it
        raw = b"\x80"
    if raw.isascii() and b"\x7f" not in raw:
        return raw.decode()
    line = json.dumps(obj, ensure_ascii=True, separators=(",", ":"), default=str)
    return line.replace("\x7f", "\\u007f")


def rfc3339(created: float) -> str:
    """A ``time.time()`` value as RFC 3339 UTC with milliseconds: ``2026-12-07T15:09:22.123Z``."""
    stamp = datetime.fromtimestamp(created, tz=UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT`` with the message's control characters escaped; a traceback's lines
    (escaped too) start with two spaces, so none of them can pass for a record."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.getMessage())
        record.asctime = self.formatTime(record, self.datefmt)
        text = self.formatMessage(record)
        for extra in _extras(self, record):
            lines = extra.splitlines() or [""]
            text += "".join(f"\n  {escape_controls(line)}" for line in lines)
        return text


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message[, exception][, stack]."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info or record.exc_text:
            entry["exception"] = record.exc_text or self.formatException(record.exc_info)  # type: ignore[arg-type]
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return to_json_line(entry)


def _extras(formatter: logging.Formatter, record: logging.LogRecord) -> list[str]:
    """The record's traceback and stack, as text (not cached on the shared record)."""
    extras = []
    if record.exc_info:
        extras.append(formatter.formatException(record.exc_info))
    elif record.exc_text:
        extras.append(record.exc_text)
    if record.stack_info:
        extras.append(formatter.formatStack(record.stack_info))
    return extras


class StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (as ``logging.lastResort``
    does), so a test runner swapping stderr never leaves it a closed stream."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> TextIO:
        return sys.stderr


def formatter(log_format: str) -> logging.Formatter:
    if log_format not in FORMATS:
        raise ValueError(f"log format {log_format!r} is not one of {', '.join(FORMATS)}")
    return JsonFormatter() if log_format == "json" else TextFormatter()


def configure(level: str = "info", log_format: str = "text") -> logging.Handler | None:
    """Log records of ``level`` and above to stderr in ``log_format``; called again, it
    replaces the handler it added before. Like ``logging.basicConfig``, it leaves alone a
    root logger that has handlers of someone else's (a test runner's): None then."""
    if level.lower() not in LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    chosen = formatter(log_format)
    root = logging.getLogger()
    if any(not isinstance(h, StderrHandler) for h in root.handlers):
        return None
    for old in list(root.handlers):
        root.removeHandler(old)
    handler = StderrHandler()
    handler.setFormatter(chosen)
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler
