"""Recording what passes between a task and its runtime's program, for golden replays (``codesdk.testing.replay``).

With ``CODESDK_RECORD_STREAMS=DIR`` (and the test instruments on: ``CODESDK_SCRIPTED_TEST_STEPS=1``, since a
recording holds prompts, tool results and whatever the runtime printed), the worker writes one JSON-lines file
per task into DIR. Each line is one thing that happened, in the order the worker saw it:

- ``start``: the runtime's name and version, the task's ``runtime.startTask`` params, and the worker's environment
  (the value of a variable whose name says it is a secret — ``_SECRET_NAME``: ``*KEY*``, ``*TOKEN*``,
  ``*SECRET*``, ``*PASSW*``, ``*AUTH*``, ``*CREDENTIAL*``, ``*COOKIE*``, ``*PRIVATE*``, ``*BEARER*``, ``*PAT`` — is
  never written: it is ``<NAME>``, also wherever a value of 8 characters or more appears later);
- ``spawn``: the runtime's program was started (its program name);
- ``stdout``: one line the program wrote; ``stdout_end``: its output ended;
- ``stdin``: what the adapter wrote to the program; ``stdin_closed``;
- ``exit``: the program's return code;
- ``answer``: the supervisor's answer to a tool call (result, denial or approval);
- ``bridge``: the task's MCP bridge endpoint was opened (its socket; its token is never written);
  ``bridge_call`` / ``bridge_answer``: a tool call the agent made through it, and what it was answered;
- ``stop``: the supervisor asked the task to stop;
- ``event``: an event the worker sent for the task (the last one is its terminal event).

A replay feeds the ``stdout`` lines, answers and stops back through the runtime's adapter without the program,
and compares the events it gets with a golden file.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from contextvars import ContextVar
from pathlib import Path
from typing import IO, Any

from .command import RECORD_STREAMS_ENV as RECORD_ENV
from .command import TEST_STEPS_ENV as _TEST_STEPS_ENV

log = logging.getLogger("codesdk.worker.recording")

#: Names of variables whose values are not written (keys, tokens, passwords).
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|AUTH|CREDENTIAL|COOKIE|PRIVATE|BEARER|PAT(?![A-Z])", re.IGNORECASE)

#: The recorder of the task whose code runs in this context (set by the worker for the task's run): what
#: ``RuntimeProcess`` records its program's stdio into.
current: ContextVar[StreamRecorder | None] = ContextVar("codesdk_stream_recorder", default=None)


def record_dir_from_env(environ: dict[str, str] | os._Environ[str] = os.environ) -> Path | None:
    """Take ``RECORD_ENV`` out of the environment (no runtime inherits it); the directory, or None when absent or
    when the test instruments are off (logged: a recording holds everything a task saw)."""
    raw = environ.pop(RECORD_ENV, None)
    if not raw:
        return None
    if environ.get(_TEST_STEPS_ENV) != "1":
        log.warning("ignoring %s: recordings are a test instrument (%s=1 enables them)", RECORD_ENV, _TEST_STEPS_ENV)
        return None
    return Path(raw)


class StreamRecorder:
    """One task's recording: a JSON-lines file, written line by line as things happen (a worker that dies leaves
    what it saw so far)."""

    def __init__(self, file: IO[str]) -> None:
        self._file: IO[str] | None = file
        #: Secrets the task holds (its bridge's token), written as placeholders.
        self._redacted: dict[str, str] = {}

    @classmethod
    def create(cls, directory: Path, task_id: str) -> StreamRecorder | None:
        """A new recording in ``directory``, named so that recordings sort in the order their tasks started; None
        (logged) if it cannot be written: the task runs unrecorded."""
        try:
            directory.mkdir(parents=True, exist_ok=True)
            safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in task_id)[:80]
            return cls(open(directory / f"{time.time_ns()}-{safe}.jsonl", "x", encoding="utf-8"))
        except OSError as exc:
            log.warning("cannot record task %s into %s: %s", task_id, directory, exc)
            return None

    def start(self, **fields: Any) -> None:
        """The recording's first line, with the worker's environment, its secrets redacted from here on."""
        environment = {}
        for name, value in os.environ.items():
            if _SECRET_NAME.search(name):
                if len(value) >= 8:  # a shorter one would be found everywhere (and guessed anyway)
                    self.redact(value, f"<{name}>")
                value = f"<{name}>"
            environment[name] = value
        self.write("start", **fields, env=environment)

    def redact(self, secret: str, placeholder: str) -> None:
        """Write ``placeholder`` wherever ``secret`` would be, from now on."""
        if secret:
            self._redacted[secret] = placeholder

    def write(self, kind: str, **fields: Any) -> None:
        if self._file is None:
            return
        try:  # redacted before it is serialized: a secret JSON would escape (a quote, a tab) is still found
            self._file.write(json.dumps(self._scrub({"kind": kind, **fields}), ensure_ascii=False) + "\n")
            self._file.flush()
        except (OSError, ValueError) as exc:  # a full disk ends the recording, never the task
            log.warning("recording stopped: %s", exc)
            self.close()

    def _scrub(self, value: Any) -> Any:
        if isinstance(value, str):
            for secret, placeholder in self._redacted.items():
                value = value.replace(secret, placeholder)
            return value
        if isinstance(value, dict):
            return {self._scrub(key): self._scrub(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self._scrub(item) for item in value]
        return value

    def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()
            except OSError:
                pass


def redact(secret: str, placeholder: str) -> None:
    """In the recording of the task running in this context, if it is recorded: ``StreamRecorder.redact``."""
    recorder = current.get()
    if recorder is not None:
        recorder.redact(secret, placeholder)


def record(kind: str, **fields: Any) -> None:
    """Into the recording of the task running in this context, if it is recorded."""
    recorder = current.get()
    if recorder is not None:
        recorder.write(kind, **fields)
