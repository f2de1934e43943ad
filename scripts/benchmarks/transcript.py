"""Case 10 (``transcript``): the supervisor's memory while it serves the transcript of a very long session.

One session of N events (200,000 in the full run) is built straight through the event store, in bulk appends of
1,000 (no runtime, no worker: a runtime would take minutes to stream them). It is one task's output, turn after
turn: 997 streamed deltas, the completed text block they make, and a tool call (requested, completed) — so its
transcript is small next to its events (2 messages per 1,000 events, ~20 KB of text each) but not trivial.

What is measured is the growth of the resident set of a **supervisor process** — the service's own ``serve``
(store, engine, pool, HTTP API on a unix socket), started fresh for each measurement — while it answers
``GET /v1/sessions/{id}/transcript`` for that session (``derive_transcript``, the same function every task start
uses), once, and four times at once. The baseline, in the same run and measured the same way: a process that does
a raw apsw ``SELECT seq, type, body`` of the same session's events and keeps the rows (``fetchall``) — what
loading the session costs with no model objects at all. Also reported, as a floor: the same SELECT streamed
through a cursor, each row ``json.loads``'ed and dropped.

How the peak is measured, and why this way: each measurement is its own process, which, right before the request
(after start-up, a warm-up transcript of a small session and a ``gc.collect``), resets the kernel's high-water mark
of its resident set (``echo 5 > /proc/self/clear_refs``, Linux >= 4.0) and reads its RSS; after the answer it reads
``VmHWM`` from ``/proc/self/status``. The kernel keeps that mark exactly (it is updated before any page leaves the
resident set), so a short peak cannot fall between two samples, as it can with psutil polling; and unlike
``ru_maxrss``, which cannot be reset, start-up (imports, opening the store) cannot hide it. Where ``clear_refs``
cannot be written, a thread samples ``VmRSS`` every millisecond instead (and the figure says so).

Run by ``scripts/bench.py --case transcript``; this module is also the child program (``python -m
benchmarks.transcript serve|raw ...``).
"""

from __future__ import annotations

import gc
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MB = 1024 * 1024
REPO = Path(__file__).resolve().parents[2]
#: The long session and the small one the supervisor is warmed up with before anything is measured.
LONG, SMALL = "ses_transcript_long", "ses_transcript_small"
DELTA = "x" * 20  # as in case 1: a typical small streamed token or two
TURN_EVENTS = 1_000  # per turn: 997 deltas, the completed block, tool call requested and completed
DELTAS_PER_TURN = TURN_EVENTS - 3
APPEND_BATCH = 1_000
#: Transcripts fetched at once in the second measurement (the issue saw 2.57 GB for four before the fix).
CONCURRENT = 4


# -- memory of this process ---------------------------------------------------------------------------------


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


class PeakMeter:
    """The peak resident set of this process between ``reset()`` and ``peak()``, in MB."""

    def __init__(self) -> None:
        self.method = "VmHWM"
        self._sampled = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def reset(self) -> float:
        """Start a measurement; returns the resident set now."""
        gc.collect()
        try:
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")  # reset the high-water mark of the resident set to what is resident now
            self.method = "VmHWM"
        except OSError:
            self.method = "VmRSS sampled every ms"
            self._sampled = _status_kb("VmRSS")
            self._stop.clear()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return _status_kb("VmRSS") / 1024

    def peak(self) -> float:
        if self._thread is None:
            return _status_kb("VmHWM") / 1024
        self._stop.set()
        self._thread.join()
        self._thread = None
        return max(self._sampled, _status_kb("VmRSS")) / 1024

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self._sampled = max(self._sampled, _status_kb("VmRSS"))


# -- building the session (in the bench process, through the store) ----------------------------------------


async def build(data_dir: Path, events: int) -> dict[str, Any]:
    """The long session (``events`` rounded down to whole turns, plus task.started, model.input and
    task.completed) and a small one of the same shape; what the long one's transcript must be."""
    from codesdk.protocol import EventType, RuntimeInfo, Trace
    from codesdk.supervisor.store import EventDraft, EventStore, TaskState, TaskUpdate

    runtime = RuntimeInfo(name="scripted")
    turns = max(1, events // TURN_EVENTS)
    started = time.perf_counter()
    async with EventStore.open(data_dir) as store:
        for session_id, session_turns in ((SMALL, 2), (LONG, turns)):
            task_id = f"task_{session_id}"
            trace = Trace(session_id=session_id, task_id=task_id)
            await store.create_session(session_id, runtime="scripted")
            await store.create_task(session_id, task_id, runtime="scripted", state=TaskState.RUNNING)
            compiled = {"messages": [{"role": "user", "blocks": [{"type": "text", "text": "go on, at length"}]}]}
            input_ref = await store.put_json_blob(compiled)

            def draft(kind: EventType, payload: dict[str, Any], trace: Trace = trace) -> EventDraft:
                return EventDraft(type=kind, runtime=runtime, payload=payload, trace=trace)

            await store.append(session_id, [
                draft(EventType.TASK_STARTED, {"task_id": task_id, "prompt_preview": "go on, at length"}),
                draft(EventType.MODEL_INPUT, {"input_ref": input_ref, "input_hash": input_ref.removeprefix("sha256:"),
                                              "message_count": 1})])
            pending: list[EventDraft] = []
            for turn in range(session_turns):
                block, call = f"b{turn}", f"call_{turn}"
                pending += [draft(EventType.MODEL_OUTPUT_DELTA, {"block_id": block, "delta": DELTA, "index": i})
                            for i in range(DELTAS_PER_TURN)]
                pending.append(draft(EventType.MODEL_OUTPUT_COMPLETED, {"block_id": block,
                                                                         "text": DELTA * DELTAS_PER_TURN}))
                identity = {"tool_call_id": call, "input_hash": "0" * 64, "tool_name": "workspace.read"}
                pending.append(draft(EventType.TOOL_CALL_REQUESTED, {**identity, "input": {"path": f"src/{turn}.py"}}))
                pending.append(draft(EventType.TOOL_CALL_COMPLETED, {**identity,
                                                                      "result_preview": f"contents of src/{turn}.py"}))
                while len(pending) >= APPEND_BATCH:
                    await store.append(session_id, pending[:APPEND_BATCH], bulk=True)
                    del pending[:APPEND_BATCH]
            await store.append(session_id, [*pending, draft(EventType.TASK_COMPLETED, {})],
                               task_update=TaskUpdate(task_id, state=TaskState.COMPLETED))
        stored = await store.last_seq(LONG)
    build_s = time.perf_counter() - started
    size_mb = sum(p.stat().st_size for p in data_dir.glob("codesdk.sqlite3*")) / MB
    return {"events": stored, "turns": turns, "messages": 1 + 2 * turns,
            "text_chars": turns * DELTAS_PER_TURN * len(DELTA), "build_s": build_s, "build_rate": stored / build_s,
            "db_mb": size_mb}


# -- the measurements (each in a child process) ---------------------------------------------------------------


def _child(*args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "scripts"), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    return subprocess.Popen([sys.executable, "-m", "benchmarks.transcript", *args], cwd=REPO, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("codesdk", timeout=300)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def _get_transcript(sock: str, token: str, session_id: str) -> dict[str, Any]:
    conn = _UnixHTTPConnection(sock)
    try:
        conn.request("GET", f"/v1/sessions/{session_id}/transcript", headers={"authorization": f"Bearer {token}"})
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"transcript of {session_id}: HTTP {response.status}: {body[:300]!r}")
        found: dict[str, Any] = json.loads(body)
        return found
    finally:
        conn.close()


def _ask(child: subprocess.Popen[str], command: str) -> dict[str, Any]:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(command + "\n")
    child.stdin.flush()
    line = child.stdout.readline()
    if not line:
        raise RuntimeError(f"the supervisor child exited (code {child.wait()}) instead of answering {command!r}")
    answer: dict[str, Any] = json.loads(line)
    return answer


def supervisor_growth(data_dir: Path, expected: dict[str, Any], concurrent: int = 1) -> dict[str, Any]:
    """Peak RSS growth (MB) of a fresh supervisor process serving ``concurrent`` transcripts of the long session
    at once, after a warm-up on the small session; checks each answer is the whole transcript."""
    sock_dir = tempfile.mkdtemp(prefix="codesdk-bench-sock-")
    sock = str(Path(sock_dir) / "api.sock")
    child = _child("serve", str(data_dir), sock)
    try:
        ready = _ask(child, "ready")
        token = (data_dir / "admin.token").read_text().strip()
        for _ in range(2):  # warm: imports, serialisers, reader threads, the HTTP path
            _get_transcript(sock, token, SMALL)
        before = _ask(child, "reset")
        answers: list[dict[str, Any]] = []
        errors: list[BaseException] = []

        def fetch() -> None:
            try:
                answers.append(_get_transcript(sock, token, LONG))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        started = time.perf_counter()
        threads = [threading.Thread(target=fetch) for _ in range(concurrent)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        after = _ask(child, "peak")
        _ask(child, "quit")
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        shutil.rmtree(sock_dir, ignore_errors=True)
    if errors:
        raise errors[0]
    for answer in answers:
        messages = answer["messages"]
        text = sum(len(b.get("text", "")) for m in messages for b in m["blocks"] if m["role"] == "assistant")
        if (len(messages), text) != (expected["messages"], expected["text_chars"]):
            raise RuntimeError(f"the transcript has {len(messages)} messages and {text} characters of text; "
                               f"expected {expected['messages']} and {expected['text_chars']}")
    return {"growth_mb": after["peak_mb"] - before["rss_mb"], "rss_before_mb": before["rss_mb"],
            "peak_mb": after["peak_mb"], "method": after["method"], "seconds": elapsed,
            "started_rss_mb": ready["rss_mb"]}


def raw_growth(data_dir: Path, mode: str) -> dict[str, Any]:
    """Peak RSS growth (MB) of a process doing a raw apsw SELECT of the long session's events: ``fetchall``
    (the rows kept) or ``stream`` (each row json.loads'ed and dropped)."""
    child = _child("raw", str(data_dir / "codesdk.sqlite3"), LONG, mode)
    out, _ = child.communicate(timeout=600)
    if child.returncode != 0:
        raise RuntimeError(f"the raw SELECT child failed (exit {child.returncode})")
    found: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return found


# -- the child programs -----------------------------------------------------------------------------------------


def _raw_main(db: str, session_id: str, mode: str) -> None:
    import apsw

    conn = apsw.Connection(db, flags=apsw.SQLITE_OPEN_READONLY)
    conn.execute("SELECT count(*) FROM events WHERE session_id = ?", (session_id,)).fetchall()  # warm, like ours
    meter = PeakMeter()
    before = meter.reset()
    query = "SELECT seq, type, body FROM events WHERE session_id = ? ORDER BY seq"
    if mode == "fetchall":
        rows = conn.execute(query, (session_id,)).fetchall()
        count = len(rows)
    else:
        count = 0
        for _, _, body in conn.execute(query, (session_id,)):
            json.loads(body)
            count += 1
    peak = meter.peak()
    conn.close()
    print(json.dumps({"growth_mb": peak - before, "rows": count, "method": meter.method}), flush=True)


def _serve_main(data_dir: str, sock: str) -> None:
    """A supervisor service (``supervisor.service.serve``: store, engine, pool, API) on ``sock``, answering the
    bench's commands on stdin (one JSON line each): ready, reset, peak, quit."""
    import logging

    import trio

    from codesdk.supervisor.service.assembly import SupervisorOptions
    from codesdk.supervisor.service.serve import Notifier, serve

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    meter = PeakMeter()

    def reply(value: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(value) + "\n")
        sys.stdout.flush()

    async def main() -> None:
        options = SupervisorOptions(data_dir=Path(data_dir), holder="scripts/bench transcript case")
        async with trio.open_nursery() as nursery:
            await nursery.start(serve, options, Path(sock), None, Notifier(""))
            stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
            buffered = b""
            while True:
                while b"\n" not in buffered:
                    chunk = await stdin.receive_some(4096)
                    if not chunk:
                        os.kill(os.getpid(), signal.SIGTERM)
                        return
                    buffered += chunk
                line, _, buffered = buffered.partition(b"\n")
                command = line.decode().strip()
                if command == "ready":
                    reply({"rss_mb": _status_kb("VmRSS") / 1024})
                elif command == "reset":
                    reply({"rss_mb": meter.reset()})
                elif command == "peak":
                    reply({"peak_mb": meter.peak(), "method": meter.method})
                else:  # quit: the service's own way out (drain, stop, close the store)
                    reply({})
                    os.kill(os.getpid(), signal.SIGTERM)
                    return

    trio.run(main)


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["serve"] and len(argv) == 3:
        _serve_main(argv[1], argv[2])
        return 0
    if argv[:1] == ["raw"] and len(argv) == 4 and argv[3] in ("fetchall", "stream"):
        _raw_main(argv[1], argv[2], argv[3])
        return 0
    print("usage: python -m benchmarks.transcript serve DATA_DIR SOCKET | raw DB SESSION fetchall|stream",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
