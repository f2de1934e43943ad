"""Lines typed while a task streams (``codesdk run``): each becomes an input for the running task (steering),
except the answer to a question the CLI is asking on the terminal (an approval, a runtime's question).

Read only when stdin is a terminal, or when ``--steer`` says so (a script piping lines in): never waited for
otherwise, so a run in CI, whose stdin is closed or empty, is not held up by it. One reader owns stdin, so an
approval's answer and a steering line never race for the same line.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import termios
from collections.abc import Awaitable, Callable, Iterator
from typing import Protocol, TextIO

import trio

#: Sends one typed line to the running task; says how it was taken ("mid_turn", "queued").
SendLine = Callable[[str], Awaitable[str]]


def reads_lines(args: argparse.Namespace, stdin: TextIO | None = None) -> bool:
    """Whether typed lines are read: ``--steer`` / ``--no-steer`` if given, else only from a terminal."""
    flag = getattr(args, "steer", None)
    if flag is not None:
        return bool(flag)
    stream = stdin if stdin is not None else sys.stdin
    try:
        return stream is not None and stream.isatty()
    except (ValueError, OSError):  # closed
        return False


class _Notes(Protocol):
    def note(self, text: str) -> None: ...


def typed_note(args: argparse.Namespace, printer: _Notes) -> Callable[[str], None]:
    """Where what became of a typed line is said: the event printer's notes, or stderr under ``--json`` (whose
    stdout holds events only)."""
    if getattr(args, "json", False):
        return lambda text: print(f"codesdk: {text}", file=sys.stderr, flush=True)
    return printer.note


class TypedLines:
    """stdin's lines while a task runs: an answer to ``ask`` when a question waits for one, else an input."""

    def __init__(self, send: SendLine, note: Callable[[str], None], stdin: TextIO | None = None) -> None:
        self._send = send
        self._note = note
        self._stdin = stdin if stdin is not None else sys.stdin
        self._answer: trio.MemorySendChannel[str] | None = None
        self._eof = False

    async def read(self, prompt: str, secret: bool = False) -> str | None:
        """``LineReader``: the next line typed goes to the prompt (an approval's, a question's), not to the task;
        None once stdin has ended. A secret is not echoed where stdin is a terminal."""
        if self._eof:  # nobody can answer any more
            return None
        send, receive = trio.open_memory_channel[str](1)
        self._answer = send
        sys.stdout.flush()
        sys.stderr.write(prompt)
        sys.stderr.flush()
        try:
            with _unechoed(self._stdin) if secret else contextlib.nullcontext():
                return await receive.receive()
        except trio.EndOfChannel:
            return None
        finally:
            self._answer = None

    async def run(self) -> None:
        """Read lines until stdin ends (or this is cancelled, when the task ends)."""
        while True:
            line = await trio.to_thread.run_sync(self._stdin.readline, abandon_on_cancel=True)
            if not line:
                self._eof = True
                if self._answer is not None:
                    self._answer.close()
                return
            if self._answer is not None:
                await self._answer.send(line)
                continue
            text = line.rstrip("\r\n")
            if not text.strip():
                continue
            try:
                delivery = await self._send(text)
            except Exception as exc:  # noqa: BLE001 - a refusal (the task ended, a bad line) is said, never fatal
                self._note(f"input not sent: {exc}")
            else:
                how = "into the running turn" if delivery == "mid_turn" else "queued for the next turn"
                self._note(f"input sent ({how})")


@contextlib.contextmanager
def _unechoed(stdin: TextIO) -> Iterator[None]:
    """Typing is not echoed meanwhile, where ``stdin`` is a terminal (the reader's thread is already waiting on it:
    the terminal's line discipline echoes as keys arrive, so turning echo off applies to the line still to come)."""
    try:
        fd = stdin.fileno()
        saved = termios.tcgetattr(fd)
    except (OSError, ValueError, termios.error):  # not a terminal: nothing echoes
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~termios.ECHO
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)
        sys.stderr.write("\n")
