"""A ``codesdk-supervisor serve`` process a test started, driven over its API socket as the admin: what the tests
with several supervisors on one database (one host, or hosts apart) share."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import httpx2 as httpx
import psutil

from tests.waits import wait_for


class ServiceProcess:
    """Set by the subclass before ``_wait_serving``: ``process``, ``log``, ``socket`` (the API socket as this
    test's file system sees it), ``token_file`` (the admin token likewise) and ``what`` (for messages)."""

    process: subprocess.Popen[bytes]
    log: Path
    socket: Path
    token_file: Path
    what: str
    client: httpx.Client

    def _wait_serving(self) -> None:
        """Wait until it answers ``/readyz``; a process that exits instead fails the test with its log's tail."""
        wait_for(f"{self.what} to serve", self._serving)
        self.client = self._client()

    def _client(self) -> httpx.Client:
        token = self.token_file.read_text().strip()
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)), base_url="http://codesdk",
                            headers={"Authorization": f"Bearer {token}"}, timeout=60)

    def _serving(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"{self.what} exited {self.process.returncode}: {self.log.read_text()[-3000:]}")
        if not (self.socket.exists() and self.token_file.exists()):
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(self.socket))
            except (FileNotFoundError, ConnectionRefusedError):
                return False
        with self._client() as client:
            return client.get("/readyz").status_code == 200

    def session(self, namespace: str, **body: Any) -> dict[str, Any]:
        response = self.client.post("/v1/sessions", json={"namespace": namespace, **body})
        assert response.status_code == 201, response.text
        return dict(response.json())

    def task(self, session_id: str, scenario: str = "echo", **config: Any) -> dict[str, Any]:
        response = self.client.post(f"/v1/sessions/{session_id}/tasks",
                                    json={"prompt": "hello", "runtime_config": {"scenario": scenario, **config}})
        assert response.status_code == 202, response.text
        return dict(response.json())

    def events(self, session_id: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        while True:
            page = self.client.get(f"/v1/sessions/{session_id}/events",
                                   params={"after_seq": events[-1]["seq"] if events else 0}).json()["events"]
            if not page:
                return events
            events += page

    def task_state(self, task_id: str) -> str:
        return str(self.client.get(f"/v1/tasks/{task_id}").json()["state"])

    def kill(self) -> None:
        """SIGKILL, as a crash would; its workers end on their stdin's EOF (reaped by pid 1 or by us)."""
        try:
            workers = [child.pid for child in psutil.Process(self.process.pid).children()]
        except psutil.Error:
            workers = []
        self.process.kill()
        self.process.wait()
        for pid in workers:
            wait_for(f"worker {pid} to end", partial(_gone, pid))

    def stop(self) -> None:
        """SIGTERM and wait (SIGKILL if it does not end within two minutes)."""
        if hasattr(self, "client"):
            self.client.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.kill()


#: How a task ends, in the events it leaves.
TERMINALS = ("task.completed", "task.failed", "task.stopped")


def fail_over(a: ServiceProcess, b: ServiceProcess, session_id: str, task_id: str) -> list[dict[str, Any]]:
    """SIGKILL ``a`` while ``task_id`` streams and wait for ``b`` to fail the task it left running: every event
    acknowledged before is kept, in seq order, and the task ends exactly once, as one whose supervisor is gone.
    The session's events as ``b`` then serves them."""
    wait_for("the task to run and stream", lambda: any(
        e["type"] == "model.output.delta" for e in a.events(session_id)))
    acknowledged = a.events(session_id)
    a.kill()
    wait_for("the other supervisor to fail the task left running", lambda: b.task_state(task_id) == "failed")
    after = b.events(session_id)
    assert after[:len(acknowledged)] == acknowledged  # every acknowledged event kept
    assert [e["seq"] for e in after] == list(range(1, len(after) + 1))
    terminals = [e for e in after if e["type"] in TERMINALS]
    assert len(terminals) == 1 and terminals[0]["payload"]["code"] == "SUPERVISOR_RESTARTED"
    return after


def _gone(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:  # not our child: pid 1 reaps it
        return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
