"""``codesdk-worker --template`` driven directly over its socket, as the pool drives it (worker/template.py)."""

from __future__ import annotations

import array
import json
import os
import socket
import struct
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from codesdk.procs.orphans import become_subreaper
from codesdk.worker.client import worker_argv

INIT = b'{"jsonrpc":"2.0","id":"i","method":"runtime.initialize","params":{"protocol_version":"1.0"}}\n'
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


class Template:
    def __init__(self, process: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.process = process
        self.sock = sock

    def ask(self, launch: bytes, fds: list[int] | None) -> dict[str, Any]:
        self.sock.sendmsg([b"F"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else [])
        self.sock.sendall(struct.pack(">I", len(launch)) + launch)
        line = b""
        while not line.endswith(b"\n"):
            chunk = self.sock.recv(1)
            assert chunk, "the template closed its socket"
            line += chunk
        answer: dict[str, Any] = json.loads(line)
        return answer


@contextmanager
def _started(*options: str) -> Iterator[Template]:
    """``codesdk-worker [options] --template`` on a socket, ready."""
    assert become_subreaper()  # what the supervisor is: the workers the template forks become our children
    ours, theirs = socket.socketpair()
    process = subprocess.Popen([*worker_argv(), *options, "--template"], stdin=theirs.fileno(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV, start_new_session=True)
    theirs.close()
    try:
        assert ours.recv(1) == b"R"
        yield Template(process, ours)
    finally:
        ours.close()
        process.wait()
        assert process.stderr is not None
        process.stderr.close()


@pytest.fixture
def template() -> Iterator[Template]:
    with _started() as started:
        yield started


def _launch(home: Path, **changes: Any) -> bytes:
    return json.dumps({"env": {**ENV, "HOME": str(home)}, "cwd": str(home), "user": None,
                       "group": None, "groups": None, **changes}).encode()


def _fork(template: Template, launch: bytes) -> tuple[dict[str, Any], int, int, int]:
    """Ask for a worker on fresh pipes: (answer, our end of its stdin, of its stdout, of its stderr)."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    answer = template.ask(launch, [in_r, out_w, err_w])
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    return answer, in_w, out_r, err_r


def _read_all(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as stream:
        return stream.read()


def test_a_forked_worker_answers_its_handshake_and_is_our_child(template: Template, tmp_path: Path) -> None:
    answer, stdin, stdout, stderr = _fork(template, _launch(tmp_path))
    pid = answer["pid"]
    os.write(stdin, INIT)
    with os.fdopen(stdout, "rb") as out:
        reply = json.loads(out.readline())
        assert reply["id"] == "i" and reply["result"]["protocol_version"].startswith("1.")
        os.close(stdin)  # EOF: the worker ends
        assert out.read() == b""
    _, status = os.waitpid(pid, 0)  # ours to reap: re-parented to us
    assert os.waitstatus_to_exitcode(status) == 0
    assert b"Traceback" not in _read_all(stderr)


def test_an_unreadable_launch_is_refused_and_the_template_serves_on(template: Template, tmp_path: Path) -> None:
    for bad in (b"not json", b"[1, 2]", json.dumps({"env": "x"}).encode()):
        answer, stdin, stdout, stderr = _fork(template, bad)
        assert "unreadable launch" in answer["error"]
        for fd in (stdin, stdout, stderr):
            os.close(fd)
    answer, stdin, stdout, stderr = _fork(template, _launch(tmp_path))
    os.close(stdin)
    assert _read_all(stdout) == b""
    _, status = os.waitpid(answer["pid"], 0)
    assert os.waitstatus_to_exitcode(status) == 0
    os.close(stderr)


def test_a_worker_that_cannot_become_its_launch_exits_127_saying_why(template: Template, tmp_path: Path) -> None:
    answer, stdin, stdout, stderr = _fork(template, _launch(tmp_path, cwd=str(tmp_path / "missing")))
    os.close(stdin)
    _, status = os.waitpid(answer["pid"], 0)
    assert os.waitstatus_to_exitcode(status) == 127
    assert _read_all(stdout) == b""
    said = _read_all(stderr).decode()
    assert "cannot become the namespace's worker" in said and "missing" in said


def test_a_request_without_its_descriptors_ends_the_template(template: Template, tmp_path: Path) -> None:
    template.sock.sendmsg([b"F"])
    assert template.process.wait() == 1
    assert template.process.stderr is not None
    assert b"unexpected request" in template.process.stderr.read()


def test_forked_workers_take_the_templates_own_options(tmp_path: Path) -> None:
    with _started("--max-frame-bytes", "1024") as template:
        answer, stdin, stdout, stderr = _fork(template, _launch(tmp_path))
        os.write(stdin, b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"pad":"' + b"a" * 2000 + b'"}}\n')
        with os.fdopen(stdout, "rb") as out:
            reply = json.loads(out.readline())
            assert "frame limit of 1024 bytes" in reply["error"]["data"]["detail"]
            os.close(stdin)
            assert out.read() == b""
        _, status = os.waitpid(answer["pid"], 0)
        assert os.waitstatus_to_exitcode(status) == 0
        os.close(stderr)
