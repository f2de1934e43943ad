"""Resource exhaustion does not stop the service (issue 12, item 2): a real ``codesdk-supervisor serve``, started at a
low RLIMIT_NOFILE (on that process only), against more connections than it has descriptors.

Every wait here is for a condition, with a deadline that only guards against a hang; nothing is timed. The one
duration the service is asked to keep (a disconnected SSE client is released within a few seconds) is a property of
the product — its peer watch looks every second — so that deadline is the requirement, not a guess at speed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import psutil
import pytest

from codesdk.client import Client, Task
from codesdk.supervisor.api import TokenAuth
from codesdk.supervisor.api.limits import MAX_REFUSING
from tests.waits import wait_for
from tests.worker.harness import REPO

SCENARIOS = str(REPO / "worker" / "adapters" / "scripted" / "scenarios")

#: The service's RLIMIT_NOFILE in these tests (soft and hard; the test process and the machine keep theirs).
NOFILE = 256
#: Half-open connections an attacker opens: more than the service has descriptors.
HALF_OPEN = 3 * NOFILE
#: Hang guard of every wait (seconds): only ever reached when something is broken.
GUARD_S = 60.0
#: How soon the service must release a disconnected SSE client's descriptor (issue 12: "within a few seconds"; it
#: was 30-75 s). The product looks at every connection's peer once a second.

#: Runs ``codesdk-supervisor`` with RLIMIT_NOFILE lowered first, in the same process (exec keeps the pid).
_LIMITED = ("import os, resource, sys; n = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); "
            "os.execv(sys.executable, [sys.executable, '-m', 'codesdk.supervisor.cli.admin', *sys.argv[2:]])")


@dataclass
class Service:
    proc: subprocess.Popen[bytes]
    data: Path
    log: Path
    port: int
    tokens: dict[str, str]
    opened: list[socket.socket] = field(default_factory=list)
    stopped: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fds(self) -> int:
        return psutil.Process(self.proc.pid).num_fds()

    def tcp_peers(self) -> int:
        """Accepted TCP connections the service still holds (any state but LISTEN)."""
        return sum(1 for c in psutil.Process(self.proc.pid).net_connections(kind="tcp")
                   if c.status != psutil.CONN_LISTEN)

    def quiet_fds(self) -> int:
        """The descriptor count once the service holds no client connection (after every client closed)."""
        wait_for("the service to close every client connection", lambda: self.tcp_peers() == 0)
        return self.fds()

    def client(self, who: str) -> Client:
        return Client(base_url=self.url, token=self.tokens[who])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int:
        """SIGTERM, as systemd stops it; its exit status."""
        self.stopped = True
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=GUARD_S)

    def healthz(self) -> tuple[int, Any]:
        with httpx.Client(base_url=self.url, timeout=GUARD_S) as http:
            response = http.get("/healthz")
            return response.status_code, response.json()

    def connect(self) -> socket.socket:
        """A raw TCP connection to the service, closed when the test ends."""
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=GUARD_S)
        self.opened.append(sock)
        return sock

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def connection_cap(self) -> int:
        found = re.search(r"API connections: at most (\d+)", self.log_text())
        assert found, self.log_text()
        return int(found.group(1))


@contextmanager
def serving(tmp_path: Path, *serve_args: str, nofile: int = NOFILE,
            tenants: tuple[str, ...] = ("alice", "bob")) -> Iterator[Service]:
    """``codesdk-supervisor serve --port 0`` at RLIMIT_NOFILE ``nofile``, with a token per tenant (bound to
    ``user:<tenant>``); stopped with SIGTERM (and its log checked for tracebacks) afterwards."""
    data = tmp_path / "data"
    auth = TokenAuth.bootstrap(data)
    tokens = {"admin": (data / "admin.token").read_text().strip()}
    for name in tenants:
        tokens[name] = auth.add_principal(name, [f"user:{name}"])
    log = tmp_path / "serve.log"
    argv = [sys.executable, "-c", _LIMITED, str(nofile), "serve", "--data-dir", str(data), "--enable-test-scenarios",
            "--port", "0", *serve_args]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, "CODESDK_SCENARIO_DIR": SCENARIOS},
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=out)
    service: Service | None = None
    try:
        def listening() -> int | None:
            assert proc.poll() is None, f"the service exited: {log.read_text(errors='replace')}"
            for conn in psutil.Process(proc.pid).net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    return int(conn.laddr.port)
            return None

        port = wait_for("the service to listen", listening)
        service = Service(proc, data, log, port, tokens)
        assert psutil.Process(proc.pid).rlimit(psutil.RLIMIT_NOFILE) == (nofile, nofile)
        wait_for("/healthz", lambda: service is not None and _healthy(service))
        yield service
        assert service.stopped or service.alive(), f"the service died: {service.log_text()}"
    finally:
        if service is not None:
            for sock in service.opened:
                sock.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=GUARD_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=GUARD_S)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text
    assert proc.returncode == 0, f"exit {proc.returncode}: {text}"


def _healthy(service: Service) -> bool:
    with contextlib.suppress(httpx.TransportError):
        return service.healthz()[0] == 200
    return False


# -- raw HTTP ------------------------------------------------------------------------------------------


def _request(method: str, path: str, token: str | None = None, *headers: str, body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: codesdk", *([f"Authorization: Bearer {token}"] if token else []),
             *headers]
    if (body or method == "POST") and not any(h.lower().startswith("content-length:") for h in headers):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def read_head(sock: socket.socket, buffer: bytearray) -> tuple[int, dict[str, str]]:
    """Read a response's status line and headers (what follows stays in ``buffer``)."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before a response's headers: {bytes(buffer)!r}"
        buffer += chunk
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    buffer[:] = rest
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], Any]:
    """One whole response with a Content-Length, its body decoded as JSON."""
    buffer = bytearray()
    status, headers = read_head(sock, buffer)
    length = int(headers["content-length"])
    while len(buffer) < length:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed inside a response body: {bytes(buffer)!r}"
        buffer += chunk
    return status, headers, json.loads(bytes(buffer[:length]))


def open_stream(service: Service, who: str, session_id: str) -> tuple[socket.socket, int, Any]:
    """An SSE stream of ``session_id`` as ``who``: (socket, 200, None) once the stream has started, or the
    refusal's (socket, status, JSON body)."""
    sock = service.connect()
    sock.sendall(_request("GET", f"/v1/sessions/{session_id}/events/stream", service.tokens[who],
                          "Accept: text/event-stream"))
    buffer = bytearray()
    status, headers = read_head(sock, buffer)
    if status != 200:
        length = int(headers["content-length"])
        while len(buffer) < length:
            buffer += sock.recv(65536)
        return sock, status, json.loads(bytes(buffer[:length]))
    assert headers["content-type"].startswith("text/event-stream"), headers
    while b": stream" not in buffer:  # the stream's first comment: the handler runs
        chunk = sock.recv(65536)
        assert chunk, "the stream closed before it started"
        buffer += chunk
    return sock, 200, None


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the service has closed (or reset) this connection: EOF is readable. Never blocks."""
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.settimeout(GUARD_S)


def run_task(client: Client, session_id: str, scenario: str = "echo") -> Task:
    task = client.start_task(session_id, "hello", runtime_config={"scenario": scenario})

    def ended() -> Task | None:
        record = client.get_task(task.task_id)
        return record if record.state not in ("pending", "running") else None

    return wait_for(f"task {task.task_id} to end", ended)


def _check_error_body(body: Any, code: str, *mentions: str) -> None:
    """A refusal is ``{"error": {"code", "message"}}`` whose message says what to do."""
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert body["error"]["code"] == code, body
    for text in mentions:
        assert text in body["error"]["message"], body


# -- the tests -----------------------------------------------------------------------------------------


def test_half_open_flood_and_stream_flood_at_a_low_descriptor_limit(tmp_path: Path) -> None:
    """More half-open TCP connections (no token, no or unfinished headers) than the service has descriptors, and more
    SSE streams from one tenant than it may hold: the service lives, /healthz answers, another tenant's task
    completes, and once the attackers close, the service's descriptors are back to their baseline."""
    streams_allowed = 16
    with serving(tmp_path, "--max-streams-per-principal", str(streams_allowed)) as service:
        cap = service.connection_cap()
        assert cap < NOFILE - 64, f"the connection cap {cap} leaves no reserve below RLIMIT_NOFILE {NOFILE}"
        with service.client("bob") as bob, service.client("alice") as alice:
            bob_session = bob.create_session(namespace="user:bob").session_id
            alice_session = alice.create_session(namespace="user:alice").session_id
            assert run_task(bob, bob_session).state == "completed"  # bob's worker runs: part of the baseline
        warm, _, _ = open_stream(service, "alice", alice_session)  # every kind of connection has been served once
        warm.close()
        baseline = service.quiet_fds()

        # 1. Half-open connections: three times RLIMIT_NOFILE of them, held open by the attacker.
        attackers: list[socket.socket] = []
        for index in range(HALF_OPEN):
            sock = service.connect()
            attackers.append(sock)
            if index % 2:  # half of them start a request and never finish its headers
                with contextlib.suppress(OSError):
                    sock.sendall(b"GET /v1/sessions HTTP/1.1\r\nHost: codesdk\r\n")
        assert service.alive(), service.log_text()
        peak = service.fds()
        wait_for("idle connections to be closed to make room", lambda: any(closed_by_peer(s) for s in attackers))

        # 2. One tenant's SSE streams: past its limit each is refused with a clear 429.
        refusals: list[Any] = []
        for _ in range(streams_allowed + 8):
            _, status, body = open_stream(service, "alice", alice_session)
            if status != 200:
                assert status == 429, (status, body)
                refusals.append(body)
        assert len(refusals) == 8, refusals
        for body in refusals:
            _check_error_body(body, "too_many_streams", "--max-streams-per-principal", str(streams_allowed))
        peak = max(peak, service.fds())

        # 3. Meanwhile, the service serves everyone else.
        assert service.healthz() == (200, {"status": "ok"})
        with service.client("bob") as bob:
            assert run_task(bob, bob_session).state == "completed"
        peak = max(peak, service.fds())
        assert service.alive(), service.log_text()
        assert peak <= baseline + cap + MAX_REFUSING, f"{peak} descriptors open with {cap} connections allowed"

        # 4. The attackers go: every descriptor they held comes back.
        for sock in service.opened:
            sock.close()
        service.opened.clear()
        after = wait_for(f"the service's descriptors to return to {baseline}",
                         lambda: (n := service.fds()) <= baseline and n)
        print(f"RLIMIT_NOFILE {NOFILE}, connection cap {cap}: fds at baseline {baseline}, under attack {peak}, "
              f"after {after}")
        assert service.healthz() == (200, {"status": "ok"})


def test_busy_connections_past_the_caps_get_clear_429_and_503(tmp_path: Path) -> None:
    """Connections each busy with a request (SSE streams): past a token's cap its next request is a 429
    ``too_many_connections``; past the total cap — lowered by the service to fit RLIMIT_NOFILE — a new connection
    gets a canned 503 ``server_busy`` while /healthz still answers 200. Once some close, others are served again."""
    per_token = 60
    tenants = ("alice", "bob", "carol", "dave")
    with serving(tmp_path, "--max-connections-per-principal", str(per_token), "--max-streams-per-principal",
                 str(per_token), tenants=tenants) as service:
        cap = service.connection_cap()
        assert cap < NOFILE - 64, f"the connection cap {cap} does not fit RLIMIT_NOFILE {NOFILE}"
        sessions = {}
        for who in tenants:
            with service.client(who) as client:
                sessions[who] = client.create_session(namespace=f"user:{who}").session_id
        with service.client("bob") as bob:
            assert run_task(bob, sessions["bob"]).state == "completed"
        baseline = service.quiet_fds()

        # alice: her cap of busy connections, then a 429 that says which flag raises it.
        held: dict[str, list[socket.socket]] = {who: [] for who in tenants}
        for _ in range(per_token):
            sock, status, body = open_stream(service, "alice", sessions["alice"])
            assert status == 200, body
            held["alice"].append(sock)
        sock = service.connect()
        sock.sendall(_request("GET", "/v1/sessions", service.tokens["alice"]))
        status, headers, body = read_response(sock)
        assert status == 429 and headers.get("retry-after") == "1", (status, headers, body)
        _check_error_body(body, "too_many_connections", "--max-connections-per-principal", str(per_token))
        wait_for("the refused connection to be closed", lambda: closed_by_peer(sock))

        # carol and dave fill the rest: then the service answers a canned 503, and /healthz its 200.
        for who in ("carol", "dave"):
            while len(held["alice"]) + len(held["carol"]) + len(held["dave"]) < cap and len(held[who]) < per_token:
                sock, status, body = open_stream(service, who, sessions[who])
                assert status == 200, (who, status, body)
                held[who].append(sock)
        assert sum(map(len, held.values())) == cap, f"{cap} connections were to fill the service"
        peak = service.fds()
        assert peak <= baseline + cap + MAX_REFUSING, f"{peak} descriptors open with {cap} connections allowed"
        sock = service.connect()
        sock.sendall(_request("GET", "/v1/sessions", service.tokens["bob"]))
        status, headers, body = read_response(sock)
        assert status == 503 and headers.get("retry-after") == "1", (status, headers, body)
        _check_error_body(body, "server_busy", f"{cap} API connections", "--max-connections")
        sock = service.connect()
        sock.sendall(_request("GET", "/healthz"))
        assert read_response(sock)[::2] == (200, {"status": "ok"})
        assert service.alive(), service.log_text()

        # dave leaves: once the service has noticed (its peer watch), bob is served again and his task completes.
        leaving = held.pop("dave")
        for sock in leaving:
            sock.close()
        wait_for("dave's connections to be released", lambda: service.fds() <= peak - len(leaving))
        with service.client("bob") as bob:
            assert run_task(bob, sessions["bob"]).state == "completed"
        for sock in service.opened:
            sock.close()
        service.opened.clear()
        after = wait_for(f"the service's descriptors to return to {baseline}",
                         lambda: (n := service.fds()) <= baseline and n)
        print(f"connection cap {cap} at RLIMIT_NOFILE {NOFILE}: fds at baseline {baseline}, with every slot busy "
              f"{peak}, after {after}")


@pytest.mark.parametrize("how", ["close", "reset", "half-close", "pipelined", "killed"])
def test_a_disconnected_stream_client_is_released(tmp_path: Path, how: str) -> None:
    """A client that goes away from an SSE stream (closes, resets, half-closes, sends another request first, or its
    process is killed) has its connection ended and its descriptor released, and its stream slot is free again.
    Before the peer watch only a failed keep-alive write noticed (30-75 s); how long it takes now is printed (well
    under a second here), not asserted: speed is the machine's business."""
    with serving(tmp_path, nofile=1024) as service:
        with service.client("alice") as alice:
            session = alice.create_session(namespace="user:alice").session_id
        warm, _, _ = open_stream(service, "alice", session)
        warm.close()
        baseline = service.quiet_fds()
        if how == "killed":
            child = subprocess.Popen([sys.executable, "-c", _STREAM_CLIENT, str(service.port),
                                      service.tokens["alice"], session], stdout=subprocess.PIPE)
            try:
                assert child.stdout is not None and child.stdout.readline() == b"streaming\n"
                streaming = service.tcp_peers()
                gone_at = time.monotonic()
                child.kill()
            finally:
                child.wait(timeout=GUARD_S)
                assert child.stdout is not None
                child.stdout.close()
        else:
            sock, status, _ = open_stream(service, "alice", session)
            assert status == 200
            streaming = service.tcp_peers()
            gone_at = time.monotonic()
            if how == "reset":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            if how == "pipelined":  # the next request waits in the server's buffer while the stream runs
                sock.sendall(_request("GET", "/healthz"))
            if how == "half-close":
                sock.shutdown(socket.SHUT_WR)
            else:
                sock.close()
        # The service held the stream's connection; the descriptor count, which other passing descriptors of the
        # service blur (a baseline taken while one was open is higher), is not what proves it.
        assert streaming >= 1
        wait_for("the stream's connection to be closed by the service", lambda: service.tcp_peers() == 0)
        released_s = time.monotonic() - gone_at
        wait_for(f"the service's descriptors to return to {baseline}", lambda: service.fds() <= baseline)
        print(f"{how}: the stream's descriptor was released {released_s:.2f} s after the client went")
        with service.client("alice") as alice:  # its stream slot is free again, and the service serves
            assert len(alice.events(session)) >= 1


#: A client process that opens an SSE stream, says so, and waits to be killed.
_STREAM_CLIENT = """
import socket, sys, time
port, token, session = sys.argv[1:]
sock = socket.create_connection(("127.0.0.1", int(port)))
sock.sendall(f"GET /v1/sessions/{session}/events/stream HTTP/1.1\\r\\nHost: x\\r\\nAuthorization: Bearer {token}"
             f"\\r\\n\\r\\n".encode())
seen = b""
while b": stream" not in seen:
    seen += sock.recv(65536)
print("streaming", flush=True)
time.sleep(3600)
"""


def test_unfinished_headers_are_cut_off_after_the_header_timeout(tmp_path: Path) -> None:
    """Connections that never finish a request's headers — sending nothing, part of them, or a byte at a time
    (slowloris) — are closed once --header-timeout has passed since they connected, however they trickle."""
    header_timeout = 2.0
    with serving(tmp_path, "--header-timeout", str(header_timeout), nofile=1024) as service:
        silent, partial, trickle = service.connect(), service.connect(), service.connect()
        started = time.monotonic()
        partial.sendall(b"GET /v1/sessions HTTP/1.1\r\nHost: codesdk\r\n")
        header = b"X-Slow: " + b"a" * 10_000
        sent = 0

        def trickled_and_cut() -> bool:
            nonlocal sent
            if closed_by_peer(trickle):
                return True
            if sent < len(header):  # bounded: the service must cut it long before it runs out
                with contextlib.suppress(OSError):
                    trickle.sendall(header[sent:sent + 1])
                sent += 1
                time.sleep(0.1)
            return False

        wait_for("the trickling connection to be cut", trickled_and_cut)
        wait_for("the silent connection to be cut", lambda: closed_by_peer(silent))
        wait_for("the partial connection to be cut", lambda: closed_by_peer(partial))
        elapsed = time.monotonic() - started  # reported, not asserted: how long it took is the machine's business
        print(f"three unfinished requests cut {elapsed:.2f} s after connecting (--header-timeout {header_timeout:g}); "
              f"the slow one had sent {sent} bytes")
        assert service.healthz() == (200, {"status": "ok"})


def test_a_body_that_does_not_arrive_in_time_gets_a_408(tmp_path: Path) -> None:
    """A request whose body is announced but never (or only partly) sent is answered 408 ``body_timeout`` with the
    flag to raise, and its connection closed."""
    body_timeout = 2.0
    with serving(tmp_path, "--body-timeout", str(body_timeout), nofile=1024) as service:
        token = service.tokens["alice"]
        for sent in (b"", b'{"namespace": "us'):
            sock = service.connect()
            started = time.monotonic()
            sock.sendall(_request("POST", "/v1/sessions", token, "Content-Type: application/json",
                                  "Content-Length: 100") + sent)
            status, headers, body = read_response(sock)
            print(f"408 after {time.monotonic() - started:.2f} s (--body-timeout {body_timeout:g})")
            assert status == 408 and headers.get("connection") == "close", (status, headers, body)
            _check_error_body(body, "body_timeout", "--body-timeout", f"{body_timeout:g} s")
            wait_for("the connection to be closed", functools.partial(closed_by_peer, sock))
        with httpx.Client(base_url=service.url, headers={"Authorization": f"Bearer {token}"}) as http:
            assert http.get("/v1/sessions").json()["sessions"] == []  # nothing was created


def _send_queue(port: int, peer: socket.socket) -> int:
    """Bytes the service's end of ``peer``'s connection holds unsent or unacknowledged (/proc/net/tcp)."""
    local = f"0100007F:{port:04X}"
    remote = f"0100007F:{peer.getsockname()[1]:04X}"
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[1] == local and fields[2] == remote:
                return int(fields[4].partition(":")[0], 16)
    return 0


def stalled_stream(service: Service, session_id: str) -> socket.socket:
    """An SSE stream of a session with more stored events than any socket buffer holds, whose client reads the
    start and then nothing more: returned once the service's writes to it are held back (its send queue is full)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    service.opened.append(sock)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
    sock.settimeout(GUARD_S)
    sock.connect(("127.0.0.1", service.port))
    sock.sendall(_request("GET", f"/v1/sessions/{session_id}/events/stream", service.tokens["alice"]))
    buffer = bytearray()
    assert read_head(sock, buffer)[0] == 200
    wait_for("the service's writes to the stream to be held back", lambda: _send_queue(service.port, sock) > 0)
    return sock


def _big_session(service: Service) -> str:
    """alice's session with ~10 MB of stored events."""
    with service.client("alice") as alice:
        session: str = alice.create_session(namespace="user:alice").session_id
        steps = [{"flood": 20_000, "delta": "x" * 400}, {"complete": {}}]
        task = alice.start_task(session, "flood", runtime_config={"scenario_inline": {"name": "big", "steps": steps}})
        wait_for("the flood to be stored", lambda: alice.get_task(task.task_id).state == "completed")
    return session


def test_a_client_that_stops_reading_is_cut_off_after_the_send_timeout(tmp_path: Path) -> None:
    """A client that stops reading its response (here an event stream of ~10 MB) holds its connection — hypercorn
    shields its writes from any cancellation — only until --send-timeout passes without it taking the next piece."""
    send_timeout = 2.0
    with serving(tmp_path, "--send-timeout", str(send_timeout), nofile=1024) as service:
        session = _big_session(service)
        baseline = service.quiet_fds()
        sock = stalled_stream(service, session)
        held_at = time.monotonic()
        assert service.fds() > baseline  # the stalled connection (and what its stream reads with) is held
        wait_for("the stalled connection to be closed", lambda: service.fds() <= baseline)
        elapsed = time.monotonic() - held_at
        print(f"a client that stopped reading was cut off {elapsed:.2f} s after its writes stalled "
              f"(--send-timeout {send_timeout:g})")
        assert "did not read its response" in service.log_text()
        assert service.healthz() == (200, {"status": "ok"})
        sock.close()


def test_a_client_that_stops_reading_does_not_keep_the_service_from_stopping(tmp_path: Path) -> None:
    """SIGTERM with a response stalled by its client (and a send timeout far away): the service ends the connection
    and exits cleanly. It used to wait for that client for ever."""
    with serving(tmp_path, "--send-timeout", "3600", nofile=1024) as service:
        session = _big_session(service)
        stalled_stream(service, session)
        assert service.stop() == 0, service.log_text()

def test_workers_past_the_descriptor_limit_fail_clearly_and_the_service_lives(tmp_path: Path) -> None:
    """Worker spawns that run into EMFILE (one tenant's tasks in more namespaces than the service has descriptors
    for) fail those tasks with WORKER_UNAVAILABLE saying so; the service lives, /healthz answers, a tenant whose
    worker runs completes its task, and the service exits cleanly."""
    nofile, namespaces = 96, 28
    with serving(tmp_path, nofile=nofile) as service:
        with service.client("bob") as bob:
            bob_session = bob.create_session(namespace="user:bob").session_id
            assert run_task(bob, bob_session).state == "completed"
        tasks = []
        with service.client("admin") as admin:
            for index in range(namespaces):
                session = admin.create_session(namespace=f"user:n{index}").session_id
                tasks.append(admin.start_task(session, "hang", runtime_config={"scenario": "hang"}).task_id)

            def settled() -> list[Task] | None:
                records = [admin.get_task(task) for task in tasks]
                return None if any(r.state == "pending" for r in records) else records

            records = wait_for("every task to be running or failed", settled)
            peak = service.fds()
            failed = [r for r in records if r.state == "failed"]
            running = [r for r in records if r.state == "running"]
            assert failed and running and len(failed) + len(running) == namespaces, records
            for record in failed:
                assert record.error is not None, record
                assert record.error["code"] == "WORKER_UNAVAILABLE", record
                assert "run out of file descriptors" in record.error["message"], record
                assert f"limit {nofile}" in record.error["message"], record
            assert service.healthz() == (200, {"status": "ok"})
            with service.client("bob") as bob:
                assert run_task(bob, bob_session).state == "completed"
            assert service.alive(), service.log_text()
            for record in running:
                admin.stop_task(record.task_id)
        print(f"RLIMIT_NOFILE {nofile}: {len(running)} workers ran, {len(failed)} tasks failed WORKER_UNAVAILABLE; "
              f"{peak} descriptors open")


#: Runs each /proc scan of the orphan sweep and the worker teardown, and a worker spawn, with no descriptor left.
_EMFILE_PROBE = """
import errno, json, os, resource, sys
import trio
from codesdk.procs.children import Children
from codesdk.procs.orphans import Orphans, reap_session
from codesdk.procs.tree import ProcessTable, descendants
from codesdk.worker.client import WorkerProcess, WorkerSpec, worker_argv

results = {}


def attempt(name, function, *args):
    try:
        results[name] = repr(function(*args))
    except BaseException as exc:
        results[name] = f"raised {type(exc).__name__}: {exc}"


async def main():
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    children = Children()
    orphans = Orphans(children)
    table = ProcessTable(orphans.scans)  # as in a supervisor, every scan here warns through one rate limit
    real_sweep, sweeps, swept = orphans.sweep, [], trio.Event()

    def counted_sweep():
        sweeps.append(1)
        if len(sweeps) >= 3:
            trio.from_thread.run_sync(swept.set)
        return real_sweep()

    orphans.sweep = counted_sweep
    held = []
    while True:  # every descriptor taken
        try:
            held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError as exc:
            assert exc.errno == errno.EMFILE, exc
            break
    attempt("adopted_orphans", orphans.adopted)
    attempt("sweep_adopted", real_sweep)
    attempt("reap_session", reap_session, os.getpid() + 1, children, orphans.scans, 0.0)
    attempt("process_tree", descendants, os.getpid(), table.scans)
    attempt("started_at", table.started_at, os.getpid())
    attempt("pipe_holders", table.pipe_holders, {1})
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(orphans.forever, 0.0)
            await swept.wait()
            nursery.cancel_scope.cancel()
        results["reap_orphans_forever"] = f"survived {len(sweeps)} sweeps"
    except BaseException as exc:
        results["reap_orphans_forever"] = f"raised {type(exc).__name__}: {exc}"
    try:
        async with trio.open_nursery() as nursery:
            spec = WorkerSpec(argv=worker_argv(), env=dict(os.environ))
            await WorkerProcess.start(nursery, spec, children=children, table=table)
        results["spawn"] = "started"
    except BaseException as exc:
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        results["spawn"] = f"raised {type(exc).__name__}: {exc}"
    for fd in held:
        os.close(fd)
    print(json.dumps(results))


trio.run(main)
"""


def test_the_orphan_sweep_and_worker_spawns_survive_emfile() -> None:
    """With every descriptor taken (in a process of its own), each /proc scan of the orphan sweep and of a worker's
    teardown answers "nothing found now" and logs what to do, the periodic sweep keeps sweeping, and a worker spawn
    fails with WorkerResourcesExhausted naming the limit — before, each raised EMFILE, which took the service down."""
    done = subprocess.run([sys.executable, "-c", _EMFILE_PROBE], cwd=REPO, capture_output=True, text=True,
                          timeout=GUARD_S, check=False)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert {name: value for name, value in results.items() if value.startswith("raised") and name != "spawn"} == {}
    assert results["reap_orphans_forever"] == "survived 3 sweeps"
    assert results["spawn"].startswith("raised WorkerResourcesExhausted: worker: the supervisor has run out of file "
                                       "descriptors (limit 64, hard 64); raise LimitNOFILE="), results["spawn"]
    assert "raise LimitNOFILE=" in done.stderr  # logged once, with what to do


#: Starts a task in a fresh namespace (so a worker is spawned) with each number of descriptors left free, from none
#: up, then one with all of them back: each start either ends its task or is refused, and the engine lives.
_EMFILE_TASKS = """
import errno, json, os, resource, sys
from pathlib import Path
import trio
from codesdk.supervisor.service.assembly import SupervisorOptions, open_engine

data_dir, scenarios = Path(sys.argv[1]), sys.argv[2]
outcomes = []


def hog(free):
    held = []
    while True:
        try:
            held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError as exc:
            assert exc.errno == errno.EMFILE, exc
            break
    for _ in range(free):
        os.close(held.pop())
    return held


async def main():
    options = SupervisorOptions(data_dir=data_dir, worker_env={"*": {"CODESDK_SCENARIO_DIR": scenarios}},
                                test_scenarios=True)
    async with open_engine(options) as engine:
        warm = await engine.create_session(namespace="user:warm")  # what a running service has loaded already
        await engine.wait_task((await engine.start_task(warm.session_id, "hi", runtime_config={"scenario": "echo"}))
                               .task_id)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        for free in range(12):
            session = await engine.create_session(namespace=f"user:n{free}")
            held = hog(free)
            try:
                task = await engine.start_task(session.session_id, "hello", runtime_config={"scenario": "echo"})
                with trio.fail_after(60):
                    record = await engine.wait_task(task.task_id)
                outcome = f"{record.state} {record.error['code'] if record.error else ''}".strip()
            except Exception as exc:
                outcome = f"refused: {type(exc).__name__}: {exc}"
            finally:
                for fd in held:
                    os.close(fd)
            outcomes.append((free, outcome))
        session = await engine.create_session(namespace="user:after")
        task = await engine.start_task(session.session_id, "hello", runtime_config={"scenario": "echo"})
        outcomes.append(("after", str((await engine.wait_task(task.task_id)).state)))
    print(json.dumps(outcomes))


trio.run(main)
"""


def test_task_starts_at_every_descriptor_shortage_end_or_are_refused_and_the_engine_lives(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _EMFILE_TASKS, str(tmp_path / "data"), SCENARIOS], cwd=REPO,
                          capture_output=True, text=True, timeout=5 * GUARD_S, check=False)
    assert done.returncode == 0, done.stderr[-5000:]
    outcomes = json.loads(done.stdout)
    print(outcomes)
    assert outcomes[-1] == ["after", "completed"], outcomes
    for free, outcome in outcomes[:-1]:
        short = outcome.startswith("refused: NamespaceUnavailable") and "out of file descriptors" in outcome
        assert outcome in ("completed", "failed WORKER_UNAVAILABLE") or outcome.startswith("refused: StoreError") \
            or short, (free, outcome)
