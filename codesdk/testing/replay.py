"""Golden replays: a recorded task played again through its runtime's adapter, without the runtime's program.

A worker started with ``CODESDK_RECORD_STREAMS=DIR`` (and ``CODESDK_SCRIPTED_TEST_STEPS=1``) records each task:
its ``runtime.startTask`` params, every line its runtime's program wrote and every message the adapter wrote to
it, the supervisor's tool answers and stops, and the events the worker sent (``worker._recording``).

``replay`` runs CodeSDK's own worker code in this process — the JSON-RPC server, the adapter, the event encoding
— on that recording: the program's stdout lines are handed to the adapter one at a time, each once everything
has settled (``trio.testing.wait_all_tasks_blocked``), and the answers and stops are sent when the task has
asked what they answer. What comes out is the adapter's mapping of that runtime output today. ``normalize``
turns it into text that stays put across recordings (ids numbered, paths and measured numbers replaced), to be
compared with a golden file: a runtime upgrade that changes its output, or an adapter change that maps it
differently, shows up as a readable diff.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing
from pydantic import ValidationError

from codesdk.protocol import (
    PROTOCOL_VERSION,
    TERMINAL_EVENT_TYPES,
    InitializeParams,
    Method,
    PeerInfo,
    ResumeMode,
    Rpc,
    RuntimeEnv,
    RuntimeEventParams,
    StartTaskParams,
    parse_worker_event,
)
from codesdk.worker.client import RpcError, WorkerConnection
from codesdk.worker.server import WorkerServer
from codesdk.worker.adapters.registry import default_registry
from codesdk.worker.adapters.runtime_process import MAX_LINE_BYTES, RuntimeProcess, stand_in
from codesdk.worker.adapters.base import stored_stand_in
from codesdk.worker.mcp.bridge import endpoint as bridge

from .invariants import check_worker_events

__all__ = ["Recording", "RecordingError", "ReplayUnavailable", "Replayed", "installed_version", "normalize", "replay",
           "to_golden"]


class RecordingError(ValueError):
    """A recording that cannot be replayed (not one, or cut short before its task started)."""


class ReplayUnavailable(RuntimeError):
    """The recording's runtime adapter refuses tasks here (its program is not installed): it checks for the
    program before it starts a task, though a replay never runs it."""


#: Each step of a recording (``worker._recording``), and the fields it must have.
_STEP_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "start": {"runtime": str, "params": dict}, "spawn": {}, "stdout": {"line": str}, "stdout_end": {},
    "stdin": {"data": str}, "stdin_closed": {}, "exit": {"returncode": int},
    "answer": {"answer": str, "tool_call_id": str}, "stop": {"reason": str}, "event": {"event": dict},
    "bridge": {"socket_path": str, "command": list},
    "bridge_call": {"call_id": (int, str), "name": str, "arguments": dict, "meta": dict},
    "bridge_answer": {"call_id": (int, str), "text": str, "is_error": bool}, "resume": {"mode": str},
}


def _type_name(kind: type | tuple[type, ...]) -> str:
    names = {str: "a string", dict: "an object", list: "a list", int: "an integer", bool: "true or false"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _event_problem(entry: dict[str, Any]) -> str | None:
    """What is wrong with an ``event`` step (its ``n`` and its event, as the worker sent them), or None."""
    if not isinstance(entry.get("n"), int) or isinstance(entry.get("n"), bool):
        return "an event step needs n (an integer)"
    try:
        parse_worker_event(entry["event"])
    except ValidationError as exc:
        return f"an event step's event is not one a worker sends: {_first_problem(exc)}"
    return None


def _first_problem(exc: ValidationError) -> str:
    error = exc.errors()[0]
    return f"{'.'.join(str(part) for part in error['loc']) or 'params'}: {error['msg']}"


@dataclass(frozen=True)
class Recording:
    """One task's recording, as the worker wrote it (``worker._recording``)."""

    path: Path
    entries: tuple[dict[str, Any], ...]

    @classmethod
    def load(cls, path: Path | str) -> Recording:
        """Read and check a recording (``RecordingError`` saying which line is wrong, and how)."""
        path = Path(path)
        entries: list[dict[str, Any]] = []
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue  # a blank line (one left at the end by an editor)
            try:
                entry = json.loads(line)
            except ValueError as exc:
                cut = " (the file ends mid-line: was it cut short?)" if number == len(lines) else ""
                raise RecordingError(f"{path}:{number}: not JSON{cut}: {exc}") from None
            if not isinstance(entry, dict) or not isinstance(entry.get("kind"), str):
                raise RecordingError(f"{path}:{number}: not a recorded step (an object with a 'kind')")
            missing = [name for name, kind in _STEP_FIELDS.get(entry["kind"], {}).items()
                       if not isinstance(entry.get(name), kind)]
            if entry["kind"] not in _STEP_FIELDS:
                raise RecordingError(f"{path}:{number}: unknown step {entry['kind']!r} (known: "
                                     f"{', '.join(sorted(_STEP_FIELDS))})")
            if missing:
                raise RecordingError(f"{path}:{number}: a {entry['kind']} step needs "
                                     + ", ".join(f"{name} ({_type_name(_STEP_FIELDS[entry['kind']][name])})"
                                                 for name in missing))
            if entry["kind"] == "start" and entries:
                raise RecordingError(f"{path}:{number}: a second start (a recording holds one task)")
            if entry["kind"] == "event" and (problem := _event_problem(entry)):
                raise RecordingError(f"{path}:{number}: {problem}")
            entries.append(entry)
        if not entries:
            raise RecordingError(f"{path}: is empty (a recording begins with its task's start)")
        if entries[0]["kind"] != "start":
            raise RecordingError(f"{path}: does not begin with the task's start (its first step is "
                                 f"{entries[0]['kind']!r})")
        try:
            StartTaskParams.model_validate(entries[0]["params"])
        except ValidationError as exc:
            raise RecordingError(f"{path}:1: the task's start params are not runtime.startTask params: "
                                 f"{_first_problem(exc)}") from None
        return cls(path, tuple(entries))

    @property
    def runtime(self) -> str:
        return str(self.entries[0]["runtime"])

    @property
    def version(self) -> str:
        return str(self.entries[0].get("version", ""))

    @property
    def params(self) -> StartTaskParams:
        return StartTaskParams.model_validate(self.entries[0]["params"])

    @property
    def complete(self) -> bool:
        """Whether the task's terminal event was recorded: not, when its worker was killed (a recording cut short,
        whose replay could only make its end up)."""
        return any(e["kind"] == "event" and e["event"]["type"] in TERMINAL_EVENT_TYPES for e in self.entries)

    @property
    def resumed_natively(self) -> bool:
        """Whether the runtime took up its own stored session when this was recorded (the ``resume`` step; before
        it was recorded, a task resumed whenever its session had a runtime session id)."""
        modes = [e["mode"] for e in self.entries if e["kind"] == "resume"]
        if modes:
            return bool(modes[0] == ResumeMode.NATIVE)
        return bool(self.params.session.runtime_session_id)

    @property
    def live_events(self) -> list[dict[str, Any]]:
        """The events the worker sent while it was recorded, as ``to_golden`` entries."""
        return [{"type": e["event"]["type"], "runtime": e["event"].get("runtime", {}), "payload": e["event"]["payload"]}
                for e in self.entries if e["kind"] == "event"]


@dataclass
class Replayed:
    """What the replay produced: the task's events (``runtime.event`` params, as the supervisor would have read
    them), and each point where the adapter did not do what the recording says it did then."""

    events: list[RuntimeEventParams]
    diverged: list[str] = field(default_factory=list)

    def as_golden_entries(self) -> list[dict[str, Any]]:
        return [{"type": str(p.event.type), "runtime": p.event.runtime.model_dump(mode="json", exclude_none=True),
                 "payload": p.event.to_json_obj()["payload"]} for p in self.events]


class _RecordedProgram:
    """The process under a ``ReplayProcess``: no pid, the exit status the recording gives."""

    pid = 0
    stdin = stdout = stderr = None

    def __init__(self) -> None:
        self.returncode: int | None = None

    async def wait(self) -> int:  # pragma: no cover - ReplayProcess never waits on it
        raise NotImplementedError


class ReplayProcess(RuntimeProcess):
    """A runtime's program as its adapter sees it (``RuntimeProcess``), played from a recording by ``_Player``."""

    def __init__(self, player: _Player, name: str) -> None:
        self._program = _RecordedProgram()
        super().__init__(self._program, name, MAX_LINE_BYTES)
        self._player = player
        self._stdin_closed = False
        # unbounded: the player hands over one line at a time anyway, and never waits on an adapter that stopped
        # reading (a stopped task's program may well have written more)
        self._lines_send, self._lines = trio.open_memory_channel[bytes](math.inf)

    async def send(self, data: bytes) -> None:
        if self._stdin_closed or self.exited.is_set():
            raise trio.BrokenResourceError("the recorded program's stdin is closed")
        self._player.written(data.decode("utf-8", "replace"))
        await trio.lowlevel.checkpoint()

    async def close_stdin(self) -> None:
        self._stdin_closed = True
        await trio.lowlevel.checkpoint()

    async def lines(self) -> AsyncIterator[bytes]:  # type: ignore[override]
        async for line in self._lines:
            yield line

    async def end(self, grace_s: float = 0.0) -> None:
        """What the adapter's end did when recorded happened then: the rest of the recording plays out."""
        with trio.CancelScope(shield=True):
            await self.exited.wait()

    # -- the player's side ----------------------------------------------------------------------

    def say(self, line: bytes) -> None:
        with contextlib.suppress(trio.ClosedResourceError):
            self._lines_send.send_nowait(line)

    def end_output(self) -> None:
        self._lines_send.close()

    def exit(self, returncode: int) -> None:
        if not self.exited.is_set():
            self._program.returncode = returncode
            self.exited.set()


class _Player:
    """Walks the recording: hands the adapter its program's output, and the supervisor's answers and stops."""

    def __init__(self, recording: Recording, connection: WorkerConnection, task_id: str,
                 events: list[RuntimeEventParams]) -> None:
        self.recording = recording
        self.connection = connection
        self.task_id = task_id
        self.events = events
        self.processes: list[ReplayProcess] = []
        self.sent: list[str] = []
        self.diverged: list[str] = []
        #: The adapter's own ids for ids the recorded messages carried (a control request's random id), and this
        #: run's bridge socket, token and command for the recorded ones.
        self.renamed: dict[str, str] = {}
        #: The MCP bridge endpoints the adapter served (ACP agents call our tools through one), with their handlers.
        self.bridges: list[tuple[bridge.BridgeEndpoint, bridge.CallHandler]] = []
        #: What the adapter answered each bridge call, by the call's id on the bridge.
        self.bridge_answers: dict[str, tuple[str, bool]] = {}
        self._calls: trio.Nursery | None = None

    def bridge_opened(self, endpoint: bridge.BridgeEndpoint, on_call: bridge.CallHandler) -> None:
        self.bridges.append((endpoint, on_call))

    def written(self, data: str) -> None:
        self.sent.append(data)

    @asynccontextmanager
    async def open(self, argv: Sequence[str], name: str) -> AsyncIterator[RuntimeProcess]:
        process = ReplayProcess(self, name)
        self.processes.append(process)
        yield process

    async def _settled(self, condition: Callable[[], bool]) -> bool:
        """Wait until ``condition`` holds or nothing else can happen without us; whether it holds."""
        while not condition():
            await trio.testing.wait_all_tasks_blocked()
            if not condition():
                return False
        await trio.testing.wait_all_tasks_blocked()
        return True

    def _rename(self, text: str) -> str:
        for recorded, actual in self.renamed.items():
            text = text.replace(recorded, actual)
        return text

    def _learn_ids(self, recorded: str, actual: str) -> None:
        """Ids the adapter chose itself (``request_id``, ``id``) where the recording has others: say those."""
        try:
            then, now = json.loads(recorded), json.loads(actual)
        except ValueError:
            return
        if isinstance(then, dict) and isinstance(now, dict) and then.get("type") == now.get("type") == "control_request":
            for key in ("request_id", "id"):
                if isinstance(then.get(key), str) and isinstance(now.get(key), str) and then[key] != now[key]:
                    self.renamed[then[key]] = now[key]

    def _asked(self, tool_call_id: str) -> bool:
        return any(p.event.to_json_obj()["payload"].get("tool_call_id") == tool_call_id for p in self.events)

    async def play(self) -> None:
        try:
            async with trio.open_nursery() as self._calls:  # bridge calls run alongside, as the agent made them
                await self._play()
        finally:  # the recording played out, was cut short (its worker was killed), or the task ended first
            for process in self.processes:
                process.end_output()
                process.exit(-signal.SIGKILL)

    async def _play(self) -> None:
        written = spawned = bridged = 0
        for entry in self.recording.entries[1:]:
            kind = entry["kind"]
            if kind == "bridge":
                bridged += 1
                if not await self._settled(lambda count=bridged: len(self.bridges) >= count):  # type: ignore[misc]
                    self.diverged.append(f"the adapter did not serve its tools to the agent (bridge #{bridged})")
                    return
                endpoint = self.bridges[bridged - 1][0]
                self.renamed[self._rename(entry["socket_path"])] = str(endpoint.socket_path)  # under TMPDIR
                self.renamed["<bridge token>"] = endpoint.token
                self.renamed.update({then: now for then, now in zip(entry["command"], bridge.bridge_command())
                                     if then != now})
            elif kind == "bridge_call":
                await self._settled(lambda: False)
                assert self._calls is not None
                self._calls.start_soon(self._bridge_call, self.bridges[-1][1], entry)
            if kind == "spawn":
                spawned += 1
                if not await self._settled(lambda count=spawned: len(self.processes) >= count):  # type: ignore[misc]
                    self.diverged.append(f"the adapter did not start program #{spawned} ({entry.get('program')})")
                    return
            elif kind == "stdin":
                written += 1
                expected = entry["data"]
                if not await self._settled(lambda written=written: len(self.sent) >= written):  # type: ignore[misc]
                    continue  # ``compare_written`` reports what it did not write
                self._learn_ids(expected, self.sent[written - 1])
            elif kind == "stdout":
                await self._settled(lambda: False)
                self.processes[-1].say(self._rename(entry["line"]).encode())
            elif kind == "stdout_end":
                await self._settled(lambda: False)
                self.processes[-1].end_output()
            elif kind == "exit":
                await self._settled(lambda: False)
                self.processes[-1].exit(int(entry["returncode"]))
            elif kind == "answer":
                await self._answer(entry)
            elif kind == "stop":
                await self._settled(lambda: False)
                await self._request(Method.STOP, {"task_id": self.task_id, "reason": entry["reason"]})
        await self._settled(lambda: False)

    def compare_written(self) -> None:
        """What the adapter wrote to its program against what it wrote when recorded, as sets: the adapter answers
        the program's requests concurrently, so their order on stdin may differ from run to run."""
        recorded = [self._rename(e["data"]) for e in self.recording.entries if e["kind"] == "stdin"]
        unmatched = list(self.sent)
        for message in recorded:
            if message in unmatched:
                unmatched.remove(message)
            else:
                self.diverged.append(f"the adapter did not write (as recorded): {message[:300]!r}")
        self.diverged += [f"the adapter wrote what it did not when recorded: {m[:300]!r}" for m in unmatched]
        for entry in self.recording.entries:
            if entry["kind"] == "bridge_answer":
                answered = self.bridge_answers.get(str(entry["call_id"]))
                then = (self._rename(entry["text"]), bool(entry["is_error"]))
                if answered != then:
                    self.diverged.append(f"bridge call {entry['call_id']} was answered {answered!r}, not {then!r} "
                                         "as when recorded")

    async def _bridge_call(self, on_call: bridge.CallHandler, entry: dict[str, Any]) -> None:
        answer = await on_call(bridge.BridgeCall(name=entry["name"], arguments=entry["arguments"], meta=entry["meta"]))
        self.bridge_answers[str(entry["call_id"])] = (answer.text, answer.is_error)

    async def _answer(self, entry: dict[str, Any]) -> None:
        tool_call_id = str(entry["tool_call_id"])
        if not await self._settled(lambda: self._asked(tool_call_id)):
            self.diverged.append(f"the task never asked about tool call {tool_call_id}, answered when recorded")
            return
        method = {"result": Method.SEND_TOOL_RESULT, "denied": Method.SEND_TOOL_DENIED,
                  "approved": Method.SEND_TOOL_APPROVED}[entry["answer"]]
        await self._request(method, {k: v for k, v in entry.items() if k not in ("kind", "answer")}
                            | {"task_id": self.task_id})

    async def _request(self, method: str, params: dict[str, Any]) -> None:
        try:
            await self.connection.request(method, params)
        except RpcError as exc:
            self.diverged.append(f"{method} was refused: {exc}")


def installed_version(runtime: str) -> str | None:
    """The version of ``runtime`` this build would run (what its adapter reports), None if it has no such runtime."""
    adapter = default_registry().adapters.get(runtime)
    return adapter.capabilities().version if adapter is not None else None


async def replay(recording: Recording, *, timeout_s: float = 120.0) -> Replayed:
    """Play ``recording`` through CodeSDK's worker and its runtime's adapter, in this process; the events the
    task sends. ``check_worker_events`` holds for them (else ``InvariantError``). The timeout only bounds a replay
    that hangs (an adapter change that waits for what the recording never gives)."""
    params = recording.params
    with tempfile.TemporaryDirectory(prefix="codesdk-replay-") as scratch, \
            _recorded_environment(recording.entries[0].get("env", {}), Path(scratch)) as moved:
        return await _replay(recording, params, moved, timeout_s)


#: Variables that say where this machine's installed things are: this run's values, not the recorded ones.
_THIS_MACHINE = frozenset({"PATH", "CODESDK_RUNTIMES_DIR", "CODESDK_SCENARIO_DIR"})
#: The worker's own directories: made anew under a scratch directory for the replay (adapters write there).
_WORKER_DIRS = ("HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "TMPDIR")


@contextlib.contextmanager
def _recorded_environment(recorded: dict[str, str], scratch: Path) -> Iterator[dict[str, str]]:
    """The process environment as the recorded worker had it (adapters read ``os.environ``), for the replay's
    duration: its directories re-rooted under ``scratch`` (the map from recorded to new paths is given), this
    machine's PATH and install locations. A secret's recorded value is its placeholder (``<NAME>``), as in the
    recording's lines."""
    moved: dict[str, str] = {}
    environment = {name: value for name, value in recorded.items() if name not in _THIS_MACHINE}
    environment.update({name: os.environ[name] for name in _THIS_MACHINE if name in os.environ})
    for name in _WORKER_DIRS:
        if recorded.get(name, "").startswith("/"):
            new = scratch / recorded[name].lstrip("/")
            new.mkdir(parents=True, exist_ok=True)
            moved[recorded[name]] = environment[name] = str(new)
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(environment)
    try:
        yield moved
    finally:
        os.environ.clear()
        os.environ.update(saved)


async def _replay(recording: Recording, params: StartTaskParams, moved: dict[str, str],
                  timeout_s: float) -> Replayed:
    registry = default_registry()
    adapter = registry.adapters.get(recording.runtime)
    if adapter is None:
        raise RecordingError(f"{recording.path}: this build has no runtime {recording.runtime!r}")
    if not (availability := adapter.availability()).available:
        raise ReplayUnavailable(f"{recording.runtime} is unavailable here: {availability.reason}")
    to_worker_send, to_worker_receive = trio.testing.memory_stream_one_way_pair()
    from_worker_send, from_worker_receive = trio.testing.memory_stream_one_way_pair()
    server = WorkerServer(registry, from_worker_send)
    connection = WorkerConnection(to_worker_send, from_worker_receive, name="replay")
    events: list[RuntimeEventParams] = []
    ended = trio.Event()
    player = _Player(recording, connection, params.task_id, events)
    player.renamed.update(sorted(moved.items(), key=lambda item: -len(item[0])))  # the longest path first

    async def collect() -> None:
        async for wire in connection.events:
            item = wire.model()  # what a recording is compared with: the protocol's models
            events.append(item)
            if item.event.type in TERMINAL_EVENT_TYPES:
                ended.set()

    token = stand_in.set(player.open)  # the worker's tasks are spawned from here: they inherit it
    bridge_token = bridge.stand_in.set(player.bridge_opened)
    resumed = recording.resumed_natively
    stored_token = stored_stand_in.set(lambda _session_id: resumed)
    try:
        with trio.fail_after(timeout_s):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_serve, server, to_worker_receive, from_worker_send)
                await nursery.start(connection.run_reader)
                nursery.start_soon(collect)
                await connection.request(Rpc.INITIALIZE, InitializeParams(
                    protocol_version=PROTOCOL_VERSION, supervisor=PeerInfo(name="codesdk-replay", version="0"),
                    env=RuntimeEnv(namespace="default", home=str(Path.home()))))  # the worker does not use them
                await connection.request(Method.START_TASK, params.to_json_obj())
                with trio.CancelScope() as playing:
                    nursery.start_soon(_until_set, ended, playing)
                    await player.play()
                await ended.wait()
                player.compare_written()
                await connection.request(Method.SHUTDOWN, {})
                await to_worker_send.aclose()
    finally:
        stored_stand_in.reset(stored_token)
        bridge.stand_in.reset(bridge_token)
        stand_in.reset(token)
    check_worker_events(events)
    if not recording.complete:
        player.diverged.append("the recording ends before its task did (its worker was killed?): the task's end "
                               "here is the replay's, not the runtime's")
    return Replayed(events, player.diverged)


async def _serve(server: WorkerServer, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream) -> None:
    """The worker, until it shuts down; then its output ends, as when its process exits."""
    try:
        await server.serve(receive)
    finally:
        await send.aclose()


async def _until_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


# -- normalizing --------------------------------------------------------------------------------

#: Ids a runtime or its model service makes up anew on each run: numbered by first appearance instead.
_VOLATILE_IDS = re.compile(
    r"\b(?:msg|toolu|call|fc|req|srvtoolu|resp|item|chatcmpl|rs|ses|prt)_[A-Za-z0-9_-]{6,}\b"
    r"|\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"
    r"|(?<![0-9a-f])[0-9a-f]{20,}(?![0-9a-f])")  # a long hex run inside another id (fc-…, a hash)
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-")
_PID = re.compile(r"\bpid \d+")
#: Measured, not decided: their values differ on every run.
_MEASURED = frozenset({"duration_ms", "duration_api_ms", "cost_usd", "total_cost_usd", "elapsed_ms", "pid", "worker_ms"})
_DROPPED = frozenset({"raw", "stderr_tail", "time"})


def normalize(entries: Iterable[dict[str, Any]], params: StartTaskParams) -> list[dict[str, Any]]:
    """Events (``Replayed.as_golden_entries``, ``Recording.live_events``) as they compare across recordings: made-up
    ids numbered by first appearance (``<toolu_1>``), the workspace as ``<workspace>``, measured numbers as
    ``<measured>``, input hashes numbered too (``<input_hash_1>``: an input is its own, and may hold a path), and
    the deltas of one block joined (``deltas``: how many there were)."""
    names: dict[str, str] = {}
    counters: dict[str, int] = {}
    hashes: dict[str, str] = {}

    def rename(match: re.Match[str]) -> str:
        found = match.group(0)
        if found not in names:
            prefix = "uuid" if _UUID.match(found) else found.split("_", 1)[0] if "_" in found else "hex"
            counters[prefix] = counters.get(prefix, 0) + 1
            names[found] = f"<{prefix}_{counters[prefix]}>"
        return names[found]

    places = [(str(params.workspace), "<workspace>")] if params.workspace else []
    places += [(params.task_id, "<task>"), (params.session.session_id, "<session>")]

    def text(value: str) -> str:
        for actual, placeholder in places:
            value = value.replace(actual, placeholder)
        return _PID.sub("pid <pid>", _cut_ids(_VOLATILE_IDS.sub(rename, value), names))

    def walk(value: Any, key: str | None = None) -> Any:
        if isinstance(value, dict):
            out = {k: walk(v, k) for k, v in value.items() if k not in _DROPPED}
            if isinstance(value.get("input_hash"), str):  # that it is the input's: ``check_worker_events``
                out["input_hash"] = hashes.setdefault(value["input_hash"], f"<input_hash_{len(hashes) + 1}>")
            return out
        if isinstance(value, list):
            return [walk(v) for v in value]
        if key in _MEASURED and isinstance(value, int | float):
            return "<measured>"
        if isinstance(value, str):
            return text(value)
        return value

    return [walk(entry) for entry in _joined_deltas(entries)]


def _cut_ids(value: str, names: dict[str, str]) -> str:
    """A made-up id cut by a preview (the tail of a longer text) at the start of ``value``, or at its end, as
    ``<…toolu_1>`` / ``<toolu_1…>``."""
    for original, placeholder in names.items():
        for size in range(len(original) - 1, 5, -1):
            if value.startswith(original[-size:]):
                return f"<…{placeholder[1:]}{value[size:]}"
            if value.endswith(original[:size]):
                return f"{value[:-size]}{placeholder[:-1]}…>"
    return value


def _joined_deltas(entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive ``model.output.delta`` events of one block as one, with their count: where a stream is cut
    into chunks is the model service's choice (and cuts made-up ids in pieces no numbering could follow)."""
    joined: list[dict[str, Any]] = []
    for entry in entries:
        payload = entry.get("payload", {})
        last = joined[-1] if joined else None
        if entry.get("type") == "model.output.delta" and last is not None and last["type"] == entry["type"] \
                and last["payload"].get("block_id") == payload.get("block_id") \
                and last["payload"].get("kind") == payload.get("kind"):
            last["payload"]["delta"] += payload.get("delta", "")
            last["payload"]["deltas"] += 1
            continue
        if entry.get("type") == "model.output.delta":
            entry = {**entry, "payload": {**{k: v for k, v in payload.items() if k != "index"}, "deltas": 1}}
        joined.append(entry)
    return joined


def to_golden(entries: Iterable[dict[str, Any]]) -> str:
    """Normalized events as a golden file's text: one event per line, keys sorted (diffs name the event)."""
    return "".join(json.dumps(entry, sort_keys=True, ensure_ascii=False) + "\n" for entry in entries)

