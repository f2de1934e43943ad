"""The outbox survives the supervisor: SIGKILL of the real service while a committed delivery is being sent loses
nothing; the service that starts next sends it again, with the same id."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from standardwebhooks import Webhook

from tests.service.test_service import _client, _start, _wait_socket, kill_and_reap
from tests.waits import wait_for


class _Held:
    """What the receiver got; the first request is held unanswered until ``release``."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.release = threading.Event()
        self.lock = threading.Lock()


@contextmanager
def _receiver() -> Iterator[tuple[_Held, int]]:
    held = _Held()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
            body = self.rfile.read(int(self.headers["content-length"]))
            with held.lock:
                held.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                first = len(held.received) == 1
            if first:
                held.release.wait()
                return  # no answer at all: the connection just ends
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield held, server.server_address[1]
    finally:
        held.release.set()
        server.shutdown()
        server.server_close()
        thread.join()


def test_sigkill_between_commit_and_answer_loses_no_delivery(tmp_path: Path) -> None:
    with _receiver() as (held, port):
        flags = ("--webhook-allow", f"127.0.0.1:{port}", "--webhook-allow-address", "127.0.0.1/32",
                 "--webhook-timeout", "600", "--webhook-retry-base", "0.1")
        proc = _start(tmp_path, None, *flags, quiet=True)
        try:
            _wait_socket(tmp_path)
            with _client(tmp_path) as client:
                created = client.post("/v1/webhooks", json={"url": f"http://127.0.0.1:{port}/",
                                                            "kinds": ["task.completed"], "namespace": "default"})
                assert created.status_code == 201, created.text
                webhook, secret = created.json()["webhook"], created.json()["secret"]
                session = client.post("/v1/sessions", json={"namespace": "default"}).json()
                task = client.post(f"/v1/sessions/{session['session_id']}/tasks",
                                   json={"prompt": "x", "runtime_config": {"scenario": "echo"}}).json()
                wait_for("the delivery to be in flight", lambda: held.received)
                [pending] = client.get(f"/v1/webhooks/{webhook['id']}/deliveries").json()["deliveries"]
                assert pending["state"] == "pending" and pending["attempts"] == 0
            kill_and_reap(proc)
        finally:
            proc.communicate(timeout=30)
        (tmp_path / "data" / "api.sock").unlink(missing_ok=True)
        proc = _start(tmp_path, None, *flags, quiet=True)
        try:
            _wait_socket(tmp_path)
            with _client(tmp_path) as client:
                wait_for("the delivery to be sent again", lambda: len(held.received) >= 2)
                done = wait_for("it to be recorded delivered", lambda: (d := client.get(
                    f"/v1/webhooks/{webhook['id']}/deliveries/{pending['id']}").json())["state"] == "delivered" and d)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
    assert [headers["webhook-id"] for headers, _ in held.received] == [pending["id"]] * 2
    headers, body = held.received[1]
    Webhook(secret).verify(body, headers)
    assert json.loads(body)["data"]["task_id"] == task["task_id"]
    assert [a["status"] for a in done["attempts"]] == [200]
