"""The service's log lines: text for people (with journald's priority prefix when stderr is the journal), or JSON,
one object per line, for a log pipeline. A record's structured facts (``extra={"audit": {...}}``,
``extra={"access": {...}}``) become fields of the JSON object; the text line already says them."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import IO, Literal

from ..terminal import one_line

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")

#: Structured facts a record may carry (its ``extra``), written as fields of its JSON line.
FACT_KEYS = ("audit", "access")

#: syslog priorities by logging level: what journald reads from a ``<N>`` line prefix (sd-daemon(3)).
_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


def priority(levelno: int) -> int:
    """The syslog priority of a logging level (a level between two takes the more severe one's)."""
    for level, value in sorted(_PRIORITY.items(), reverse=True):
        if levelno >= level:
            return value
    return 7


def stream_is_journal(stream: IO[str]) -> bool:
    """Whether ``stream`` is connected to the journal: systemd sets ``JOURNAL_STREAM`` to its device and inode."""
    expected = os.environ.get("JOURNAL_STREAM", "")
    if not expected:
        return False
    try:
        stat = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return expected == f"{stat.st_dev}:{stat.st_ino}"


class TextFormatter(logging.Formatter):
    """``LEVEL logger: message``, prefixed by ``<N>`` (its syslog priority) for journald, which then files the line
    at that priority and drops the prefix. The message is one line whatever it holds: control characters (a
    request's path, say) are shown escaped, so nobody can forge a line or drive the reader's terminal."""

    def __init__(self, journal: bool) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")
        self.journal = journal

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return self._style.format(_Escaped(record))

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if not self.journal:
            return text
        prefix = f"<{priority(record.levelno)}>"
        return "\n".join(prefix + line for line in text.splitlines())  # each line of a traceback, too


class _Escaped:
    """A record whose message is shown on one line (``terminal.one_line``), for the text format's template."""

    def __init__(self, record: logging.LogRecord) -> None:
        self.__dict__.update(record.__dict__)
        self.message = one_line(record.message)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``priority``, ``logger``, ``message``, the
    record's facts (``audit``, ``access``) and, for an exception, ``exception`` (its traceback as text)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace(
                "+00:00", "Z"),
            "level": record.levelname,
            "priority": priority(record.levelno),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in FACT_KEYS:
            facts = record.__dict__.get(key)
            if isinstance(facts, dict):
                line[key] = facts
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str, separators=(",", ":"))


@contextmanager
def configured(level: str, log_format: LogFormat, stream: IO[str] | None = None) -> Iterator[logging.Handler]:
    """While it lasts, the root logger writes to ``stream`` (stderr) at ``level`` in ``log_format``; then the
    handler goes and the level is what it was (a service run from a test leaves the test's logging as it found it)."""
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(stream_is_journal(stream)))
    root = logging.getLogger()
    level_before = root.level
    root.addHandler(handler)
    root.setLevel(level.upper())
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level_before)
