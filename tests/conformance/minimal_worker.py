"""A minimal, stand-alone worker for the CodeSDK worker protocol 1.0.

Written from ``docs/protocol.md`` alone: nothing of CodeSDK's own worker, protocol package, supervisor or fixtures
was read or imported, and only the standard library is used. It exists to show that the conformance suite (§12)
holds a worker to the document rather than to the reference implementation. It offers one runtime, ``scripted``,
which plays the four scenarios of the "Conformance runtime" subsection of §10 (``echo``, ``parallel-tools``,
``write-or-deny``, ``hang``), chosen by ``runtime_config.scenario``.

Run: ``python tests/conformance/minimal_worker.py [--max-frame-bytes N] [--break MODE]``. ``--break`` selects a
deliberately broken variant, each breaking exactly one rule, so that the suite can be seen to fail:

- ``logs-on-stdout``: a human log line (not JSON) on the protocol stream for every request handled;
- ``events-before-response``: a task's first event is written before its ``runtime.startTask`` response;
- ``no-terminal-event``: tasks never emit their terminal event (also when stopped or at shutdown);
- ``ordinal-gap``: every task skips ``n`` = 3 (…, 2, 4, 5, …).

Threads: the main thread reads stdin and handles one request at a time; each task runs in its own thread; one
writer thread owns the protocol output. A single condition (``Worker.cond``) guards all state: a request is
handled and its response queued while holding it, and every event is numbered and queued while holding it, so a
response is always queued before the events it causes.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import logging
import os
import queue
import re
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, NoReturn

PROTOCOL_VERSION = "1.0"
RUNTIME = "scripted"
MODEL = "scripted-1"
MAX_DEPTH = 200
MAX_INT_DIGITS = 4300
BREAK_MODES = ("logs-on-stdout", "events-before-response", "no-terminal-event", "ordinal-gap")
BATCH_MESSAGE = "batch requests are not supported by this protocol; send one object per line"
SCENARIO_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]{0,63}")
SURROGATE = re.compile("[\ud800-\udfff]")
ABSENT: Any = object()  # "no id member": the request is a notification

CAPABILITIES: dict[str, Any] = {  # §3.1, every field sent (max_concurrent_tasks: no limit, so omitted)
    "name": RUNTIME, "version": "1.0", "isolation_modes": ["in_process"], "requires_auth": False,
    "auth_methods": ["none"], "streaming_text": True, "streaming_thinking": True, "streaming_tool_output": False,
    "tool_calls": True, "parallel_tool_calls": True, "tool_routing": ["in_band"], "builtin_tools": [],
    "builtin_tools_default_enabled": False, "permission_prompts": False,
    "permission_modes": ["ask", "auto", "yolo"], "interaction_modes": ["non_interactive", "interactive"],
    "session_create": True, "session_resume": True, "session_fork": False, "transcript_input": True,
    "cancellation": "cooperative", "usage_reporting": True, "cost_reporting": False, "models": [MODEL],
    "default_model": MODEL,
}
AUTH_STATUS = {"runtime": RUNTIME, "state": "not_required", "method": "none", "message": "no credentials needed"}

log = logging.getLogger("minimal-worker")


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = ABSENT, rid: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data, self.rid = code, message, data, rid


# --- §1.2 framing ---------------------------------------------------------------------------------------------


class Framer:
    """Splits input into lines; a line crossing the limit is reported (as None) before its newline arrives."""

    def __init__(self, limit: int) -> None:
        self.limit, self.buf, self.discarding = limit, bytearray(), False

    def _over(self) -> bool:  # a trailing \r may be the CR of CRLF, so it is not counted
        return len(self.buf) - self.buf.endswith(b"\r") > self.limit

    def feed(self, data: bytes) -> Iterator[bytes | None]:
        pos = 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            end = len(data) if nl < 0 else nl
            if not self.discarding:
                self.buf += data[pos:end]
                if self._over():
                    self.buf.clear()
                    self.discarding = True
                    yield None
                elif nl >= 0:
                    line = bytes(self.buf[:-1] if self.buf.endswith(b"\r") else self.buf)
                    self.buf.clear()
                    yield line
            if nl >= 0:
                self.discarding = False
            pos = end + 1

    def finish(self) -> Iterator[bytes | None]:
        if self.buf and not self.discarding:  # a final line without \n still counts
            yield bytes(self.buf[:-1] if self.buf.endswith(b"\r") else self.buf)
        self.buf.clear()


# --- §1.3 strict JSON, §1.4 envelope ----------------------------------------------------------------------------


def _constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text} overflows a double")
    return value


def _int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise ValueError(f"integer of {digits} digits exceeds the limit ({MAX_INT_DIGITS} digits)")
    return int(text)


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def _tree_problem(value: Any) -> str | None:
    """Lone surrogate escapes (paired ones are joined by the parser) and nesting deeper than 200 levels."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str) and SURROGATE.search(item):
            return "lone UTF-16 surrogate escape"
        if isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                return f"nesting too deep (more than {MAX_DEPTH} levels)"
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
            if isinstance(item, dict):
                stack.extend((key, depth) for key in item)
    return None


def _readable_id(msg: Any) -> Any:
    rid = msg.get("id") if isinstance(msg, dict) else None
    if isinstance(rid, bool) or not isinstance(rid, (int, float, str)):
        return None
    return None if isinstance(rid, str) and SURROGATE.search(rid) else rid


def parse_request(line: bytes) -> tuple[Any, str, Any]:
    """Decode one frame into (id or ABSENT, method, params); RpcError for every line-level problem."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RpcError(-32700, "Parse error", {"detail": f"not UTF-8: {exc.reason} at byte {exc.start}"}) from None
    try:
        msg = json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int,
                         object_pairs_hook=_pairs)
    except RecursionError:
        raise RpcError(-32700, "Parse error", {"detail": "invalid JSON: nesting too deep"}) from None
    except ValueError as exc:
        raise RpcError(-32700, "Parse error", {"detail": f"invalid JSON: {exc}"}) from None
    problem = _tree_problem(msg)
    if problem:
        raise RpcError(-32700, "Parse error", {"detail": f"invalid JSON: {problem}"}, _readable_id(msg))
    if isinstance(msg, list):
        raise RpcError(-32600, BATCH_MESSAGE)
    invalid = RpcError(-32600, "Invalid request", "The request failed schema validation", _readable_id(msg))
    if not isinstance(msg, dict):
        raise invalid
    rid = msg.get("id", ABSENT)
    if rid is not ABSENT and rid is not None and _readable_id(msg) is None:  # bool, object, array ids
        raise invalid
    if (set(msg) - {"jsonrpc", "id", "method", "params"} or msg.get("jsonrpc") != "2.0"
            or not isinstance(msg.get("method"), str)
            or ("params" in msg and not isinstance(msg["params"], (dict, list)))):
        raise invalid
    return rid, msg["method"], msg.get("params", {})


# --- §1.5 params models (extra="forbid" at every level) ---------------------------------------------------------

Errors = list[dict[str, str]]
Check = Callable[[Any, str], Errors]


def _err(loc: str, msg: str, kind: str) -> Errors:
    return [{"loc": loc, "msg": msg, "type": kind}]


def string(lo: int = 0, hi: int | None = None, pattern: str | None = None) -> Check:
    def check(v: Any, loc: str) -> Errors:
        if not isinstance(v, str):
            return _err(loc, "Input should be a valid string", "string_type")
        if len(v) < lo:
            return _err(loc, f"String should have at least {lo} character{'s' * (lo > 1)}", "string_too_short")
        if hi is not None and len(v) > hi:
            return _err(loc, f"String should have at most {hi} characters", "string_too_long")
        if pattern and not re.fullmatch(pattern, v):
            return _err(loc, f"String should match pattern '{pattern}'", "string_pattern_mismatch")
        return []
    return check


def enum(*values: str) -> Check:
    def check(v: Any, loc: str) -> Errors:
        return [] if v in values and isinstance(v, str) else _err(
            loc, "Input should be " + " or ".join(repr(x) for x in values), "enum")
    return check


def boolean(v: Any, loc: str) -> Errors:
    return [] if isinstance(v, bool) else _err(loc, "Input should be a valid boolean", "bool_type")


def anything(v: Any, loc: str) -> Errors:
    return []


def json_object(v: Any, loc: str) -> Errors:
    return [] if isinstance(v, dict) else _err(loc, "Input should be a valid dictionary", "dict_type")


def nullable(check: Check) -> Check:
    return lambda v, loc: [] if v is None else check(v, loc)


def array(item: Check) -> Check:
    def check(v: Any, loc: str) -> Errors:
        if not isinstance(v, list):
            return _err(loc, "Input should be a valid list", "list_type")
        return [e for i, x in enumerate(v) for e in item(x, f"{loc}.{i}")]
    return check


def model(required: dict[str, Check], optional: dict[str, Check] | None = None) -> Check:
    fields = {**required, **(optional or {})}

    def check(v: Any, loc: str) -> Errors:
        if not isinstance(v, dict):
            return _err(loc, "Input should be a valid dictionary", "dict_type")
        at = (lambda k: f"{loc}.{k}") if loc else (lambda k: k)
        errors = [e for k in v if k not in fields for e in _err(at(k), "Extra inputs are not permitted",
                                                              "extra_forbidden")]
        errors += [e for k in required if k not in v for e in _err(at(k), "Field required", "missing")]
        return errors + [e for k, c in fields.items() if k in v for e in c(v[k], at(k))]
    return check


TEXT = string()
BLOCKS = {
    "text": model({"type": TEXT, "text": TEXT}),
    "code": model({"type": TEXT, "code": TEXT}, {"language": nullable(TEXT)}),
    "thinking": model({"type": TEXT, "text": TEXT}),
    "tool_use": model({"type": TEXT, "tool_call_id": TEXT, "name": TEXT}, {"input": json_object}),
    "tool_result": model({"type": TEXT, "tool_call_id": TEXT},
                         {"content": anything, "is_error": boolean, "denied": boolean}),
}


def block(v: Any, loc: str) -> Errors:
    kind = v.get("type") if isinstance(v, dict) else None
    if isinstance(kind, str) and kind in BLOCKS:
        return BLOCKS[kind](v, loc)
    return _err(f"{loc}.type", f"Input tag should be one of {', '.join(BLOCKS)}", "union_tag_invalid")


OPTIONAL_TEXT = nullable(TEXT)
CALL = {"task_id": TEXT, "tool_call_id": TEXT}
PARAMS: dict[str, Check] = {
    "runtime.initialize": model({"protocol_version": TEXT}, {
        "supervisor": nullable(model({"name": TEXT, "version": TEXT})),
        "env": nullable(model({"namespace": TEXT, "home": TEXT}, {
            "isolation": enum("shared", "namespaced", "ephemeral"),
            "mode": enum("in_process", "subprocess", "server_side"), "variable_names": array(TEXT),
            **{k: OPTIONAL_TEXT for k in ("xdg_config_home", "xdg_state_home", "xdg_cache_home",
                                          "xdg_data_home", "tmpdir", "path")}}))}),
    "runtime.getAuthStatus": model({"runtime": TEXT}),
    "runtime.ensureLogin": model({"runtime": TEXT}),
    "runtime.startTask": model({
        "runtime": TEXT, "task_id": string(1, 200),
        "session": model({"session_id": string(1, 200)}, {"runtime_session_id": OPTIONAL_TEXT})}, {
        "workspace": OPTIONAL_TEXT,
        "messages": array(model({"role": enum("system", "user", "assistant", "tool")}, {"blocks": array(block)})),
        "tool_manifest": model({}, {"tools": array(model({"name": string(1, 128, r"[A-Za-z0-9_.\-]+")}, {
            "description": TEXT, "input_schema": json_object,
            "tool_class": enum("read_only", "write", "dangerous", "network")}))}),
        "permission_mode": enum("ask", "auto", "yolo"),
        "interaction_mode": enum("non_interactive", "interactive"), "runtime_config": json_object,
        "trace": model({}, {k: OPTIONAL_TEXT for k in ("request_id", "client_id", "user_id")})}),
    "runtime.sendToolResult": model(CALL, {"result": anything, "is_error": boolean}),
    "runtime.sendToolDenied": model(CALL, {"reason": TEXT}),
    "runtime.sendToolApproved": model(CALL, {"reason": TEXT, "scope": enum("once", "task", "session", "rule")}),
    "runtime.sendInput": model({"task_id": TEXT, "input_id": string(1, 200), "input": anything}),
    "runtime.stop": model({"task_id": TEXT}, {"reason": OPTIONAL_TEXT}),
    "runtime.shutdown": model({}),
}


# --- helpers ---------------------------------------------------------------------------------------------------


def canonical(value: Any) -> str:
    """RFC 8785 for the values used here (objects, arrays, strings, integers, integral floats)."""
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: kv[0].encode("utf-16-be"))
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{canonical(v)}" for k, v in items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(canonical(v) for v in value) + "]"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    return json.dumps(value, ensure_ascii=False)


def input_hash(value: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical(value).encode("utf-8")).hexdigest()


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- tasks and scenarios ---------------------------------------------------------------------------------------


class Stopped(Exception):
    pass


@dataclass
class Answer:
    denied: bool
    value: Any  # the result, or the denial reason
    is_error: bool = False

    def member(self, key: str) -> str:  # §9.3 rendering of {{result:<id>.<key>}}
        if self.denied or not isinstance(self.value, dict) or key not in self.value:
            return "(no value)"
        value = self.value[key]
        return value if isinstance(value, str) else json.dumps(value)


class Task:
    def __init__(self, worker: Worker, params: dict[str, Any], scenario: str) -> None:
        self.worker, self.scenario, self.task_id = worker, scenario, params["task_id"]
        session = params["session"]
        self.session_id = session["session_id"]
        self.rsid = session.get("runtime_session_id") or f"scripted-{self.session_id}"
        users = [m for m in params.get("messages", []) if m["role"] == "user"]
        blocks = users[-1].get("blocks", []) if users else []
        self.prompt = "".join(b.get("text", b.get("code", "")) for b in blocks if b["type"] in ("text", "code"))
        self.n = self.requests = self.blocks = 0
        self.request_open, self.preview = False, ""
        self.stop_reason: str | None = None
        self.pending: set[str] = set()
        self.answers: dict[str, Answer] = {}
        self.inputs: set[str] = set()  # the input ids sent to it (runtime.sendInput), each once
        self.thread = threading.Thread(target=self.run, name=f"task-{self.task_id}", daemon=True)

    def emit(self, kind: str, payload: dict[str, Any], terminal: bool = False) -> None:
        with self.worker.cond:
            if self.stop_reason is not None and not terminal:
                raise Stopped
            self.n += 1
            if self.worker.broken == "ordinal-gap" and self.n == 3:
                self.n = 4
            runtime = {"name": RUNTIME, "model": MODEL, "runtime_session_id": self.rsid}
            event = {"type": kind, "time": now(), "runtime": runtime, "payload": payload}
            self.worker.send({"jsonrpc": "2.0", "method": "runtime.event",
                              "params": {"task_id": self.task_id, "n": self.n, "event": event}})
            self.worker.cond.notify_all()

    def open_request(self) -> None:
        if not self.request_open:
            self.requests += 1
            self.emit("runtime.request.started", {"request_id": f"{self.task_id}:r{self.requests}", "model": MODEL})
            self.request_open = True

    def close_request(self, stop_reason: str) -> None:
        if self.request_open:
            self.emit("runtime.request.completed",
                      {"request_id": f"{self.task_id}:r{self.requests}", "stop_reason": stop_reason})
            self.request_open = False

    def output(self, text: str, kind: str = "text", chunk: int = 16) -> None:
        self.open_request()
        self.blocks += 1
        block_id = f"{self.task_id}:b{self.blocks}"
        for index, start in enumerate(range(0, len(text), chunk)):
            self.emit("model.output.delta",
                      {"block_id": block_id, "kind": kind, "delta": text[start:start + chunk], "index": index})
        self.emit("model.output.completed", {"block_id": block_id, "kind": kind, "text": text})
        if kind == "text":
            self.preview = text[-200:]

    def wait_until(self, ready: Callable[[], bool]) -> None:
        with self.worker.cond:
            while self.stop_reason is None and not ready():
                self.worker.cond.wait()
            if self.stop_reason is not None:
                raise Stopped

    def tool_calls(self, calls: list[tuple[str, str, dict[str, str]]]) -> dict[str, Answer]:
        """Request every call, close the request, then wait for all answers (any order, no timeout)."""
        self.open_request()
        for call_id, name, tool_input in calls:
            with self.worker.cond:  # pending before the request is on the wire, so a fast answer finds it
                self.pending.add(call_id)
                self.emit("tool.call.requested", {
                    "tool_call_id": call_id, "runtime_tool_call_id": call_id, "attempt": 1,
                    "input_hash": input_hash(tool_input), "tool_name": name, "input": tool_input,
                    "executed_by": "supervisor"})
        self.close_request("tool_use")
        self.wait_until(lambda: not self.pending)
        return self.answers

    def usage(self) -> None:
        self.emit("usage.reported", {"model": MODEL, "input_tokens": 12, "output_tokens": 7, "cache_read_tokens": 0,
                                     "cache_write_tokens": 0, "reasoning_tokens": 0})

    def complete(self) -> tuple[str, dict[str, Any]]:
        self.close_request("end_turn")
        return "task.completed", {"stop_reason": "end_turn", "result_preview": self.preview}

    def run(self) -> None:
        outcome: tuple[str, dict[str, Any]] | None
        try:
            outcome = SCENARIOS[self.scenario](self)
        except Stopped:
            outcome = None
        except Exception as exc:  # any adapter error ends the task, never the worker
            log.exception("task %s failed", self.task_id)
            outcome = "task.failed", {"code": "RUNTIME_ERROR", "retryable": False, "details": {},
                                      "message": f"runtime adapter error: {type(exc).__name__}: {exc}"}
        with self.worker.cond:
            if outcome is None:
                outcome = "task.stopped", {"reason": self.stop_reason, "requested_by": "supervisor"}
            if self.worker.broken != "no-terminal-event":
                self.emit(*outcome, terminal=True)
            del self.worker.tasks[self.task_id]  # released only once the terminal event is queued
            self.worker.cond.notify_all()


def play_echo(t: Task) -> tuple[str, dict[str, Any]]:
    t.output(f"You said: {t.prompt}", chunk=8)
    t.usage()
    return t.complete()


def play_parallel_tools(t: Task) -> tuple[str, dict[str, Any]]:
    t.output("The user wants both files; read them in parallel.", kind="thinking", chunk=32)
    t.output("Reading a.txt and b.txt.")
    answers = t.tool_calls([("call_a", "workspace.read", {"path": "a.txt"}),
                            ("call_b", "workspace.read", {"path": "b.txt"})])
    denied = [f"{cid}: {a.value}" for cid, a in answers.items() if a.denied]
    if denied:
        t.output("Could not read everything (" + "; ".join(denied) + ").")
    else:
        t.output(f"a.txt says {answers['call_a'].member('text')}; b.txt says {answers['call_b'].member('text')}")
    t.usage()
    return t.complete()


def play_write_or_deny(t: Task) -> tuple[str, dict[str, Any]]:
    t.output("Writing out.txt.")
    answer = t.tool_calls([("call_write", "workspace.write", {"path": "out.txt", "content": "hello\n"})])
    result = answer["call_write"]
    if result.denied:
        t.output(f"The write was denied: {result.value}")
    else:
        t.output("The write failed." if result.is_error else "Wrote out.txt.")
    return t.complete()


def play_hang(t: Task) -> tuple[str, dict[str, Any]]:
    t.output("Working on it; this takes until someone stops it.")
    t.wait_until(lambda: False)
    raise AssertionError("unreachable")


SCENARIOS: dict[str, Callable[[Task], tuple[str, dict[str, Any]]]] = {
    "echo": play_echo, "parallel-tools": play_parallel_tools, "write-or-deny": play_write_or_deny,
    "hang": play_hang,
}


# --- the worker ------------------------------------------------------------------------------------------------


class Worker:
    def __init__(self, out: BinaryIO, max_frame_bytes: int, broken: str | None) -> None:
        self.out, self.max_frame_bytes, self.broken = out, max_frame_bytes, broken
        self.outgoing: queue.Queue[bytes | None] = queue.Queue(maxsize=256)  # bounded: emitters block
        self.writer = threading.Thread(target=self._write, name="writer", daemon=True)
        self.cond = threading.Condition()
        self.initialized = False
        self.tasks: dict[str, Task] = {}

    def _write(self) -> None:
        try:
            while (line := self.outgoing.get()) is not None:
                self.out.write(line)
                if self.outgoing.empty():
                    self.out.flush()
            self.out.flush()
        except OSError:
            log.warning("protocol output closed by the supervisor")
            os._exit(0)

    def send(self, message: dict[str, Any]) -> None:
        text = json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        self.outgoing.put(text.encode("utf-8") + b"\n")

    def reply(self, rid: Any, result: Any = None, error: RpcError | None = None) -> None:
        if error is None:
            self.send({"jsonrpc": "2.0", "id": rid, "result": result})
            return
        body: dict[str, Any] = {"code": error.code, "message": error.message}
        if error.data is not ABSENT:
            body["data"] = error.data
        self.send({"jsonrpc": "2.0", "id": rid, "error": body})

    def serve(self) -> None:
        self.writer.start()
        framer = Framer(self.max_frame_bytes)
        while True:
            try:
                data = os.read(0, 1 << 16)
            except OSError:
                data = b""
            # all() stops at runtime.shutdown: later lines are not read (the worker does not wait for EOF)
            if not all(self.handle(line) for line in (framer.feed(data) if data else framer.finish())) or not data:
                break
        self.finish()

    def handle(self, line: bytes | None) -> bool:
        """Handle one frame; False once runtime.shutdown was accepted."""
        if line is None:
            detail = f"line exceeds the frame limit of {self.max_frame_bytes} bytes; discarded"
            self.reply(None, error=RpcError(-32001, "Frame too large", {"detail": detail}))
            return True
        if not line.strip(b" \t\r\x0b\x0c"):
            return True
        try:
            rid, method, params = parse_request(line)
        except RpcError as exc:
            log.warning("refused a line: %s %s", exc.code, exc.data)
            self.reply(exc.rid, error=exc)
            return True
        with self.cond:
            if self.broken == "logs-on-stdout":
                self.outgoing.put(f"minimal-worker: handling {method}\n".encode())
            try:
                result = self.dispatch(method, params)
            except RpcError as exc:
                if rid is not ABSENT:
                    self.reply(rid, error=exc)
                return True
            except Exception as exc:
                log.exception("handler for %s raised", method)
                if rid is not ABSENT:
                    self.reply(rid, error=RpcError(-32603, "Internal error", f"{type(exc).__name__}: {exc}"))
                return True
            if rid is not ABSENT:  # a notification is executed, never answered
                self.reply(rid, result)
            return method != "runtime.shutdown"

    def dispatch(self, method: str, params: Any) -> Any:
        if method not in PARAMS:
            raise RpcError(-32601, "Method not found", method)
        if isinstance(params, list):
            if params:
                raise RpcError(-32602, "Invalid params", "too many positional arguments")
            params = {}
        if method == "runtime.shutdown":
            if params:
                raise RpcError(-32602, "Invalid params", {"detail": "runtime.shutdown takes no params"})
            return {"ok": True}
        if not self.initialized and method != "runtime.initialize":
            raise RpcError(-32002, "call runtime.initialize first")
        errors = PARAMS[method](params, "")
        if errors:
            raise RpcError(-32602, "Invalid params", {"errors": errors})
        return getattr(self, method.removeprefix("runtime."))(params)

    def initialize(self, p: dict[str, Any]) -> Any:
        version = p["protocol_version"]
        if version.split(".")[0] != PROTOCOL_VERSION.split(".")[0]:
            raise RpcError(-32003, f"protocol {version} is not supported; this worker speaks {PROTOCOL_VERSION}",
                           {"supported": [PROTOCOL_VERSION]})
        self.initialized = True
        offer = {"name": RUNTIME, "version": "1.0", "available": True, "capabilities": CAPABILITIES}
        return {"protocol_version": PROTOCOL_VERSION, "worker": {"name": "minimal-worker", "version": "0.1.0"},
                "pid": os.getpid(), "runtimes": [offer]}

    def _runtime(self, name: str) -> None:
        if name != RUNTIME:
            raise RpcError(-32004, f"unknown runtime {name!r}", {"known": [RUNTIME]})

    def getAuthStatus(self, p: dict[str, Any]) -> Any:
        self._runtime(p["runtime"])
        return AUTH_STATUS

    def ensureLogin(self, p: dict[str, Any]) -> Any:
        self._runtime(p["runtime"])
        return {"status": AUTH_STATUS, "logged_in": True, "instructions": "nothing to do"}

    def startTask(self, p: dict[str, Any]) -> Any:
        self._runtime(p["runtime"])
        task_id, session_id = p["task_id"], p["session"]["session_id"]
        if task_id in self.tasks:
            raise RpcError(-32006, f"task {task_id!r} is already active in this worker")
        for other in self.tasks.values():
            if other.session_id == session_id:
                raise RpcError(-32007, f"session {session_id!r} already has an active task ({other.task_id}); "
                               "stop it or wait for it to end", {"active_task_id": other.task_id})
        config = p.get("runtime_config", {})
        scenario = config.get("scenario", "echo")
        if "scenario_inline" in config:
            raise RpcError(-32011, "scenario_inline is not supported by this worker", None)
        if not isinstance(scenario, str):
            raise RpcError(-32011, "runtime_config.scenario must be a scenario name (string)", None)
        if not SCENARIO_NAME.fullmatch(scenario) or scenario not in SCENARIOS:
            raise RpcError(-32011, f"unknown scenario {scenario!r}; known: {', '.join(sorted(SCENARIOS))}", None)
        grace = config.get("stop_grace_s", 2.0)
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
            raise RpcError(-32012, "runtime_config.stop_grace_s must be a number >= 0", None)
        task = self.tasks[task_id] = Task(self, p, scenario)
        task.thread.start()  # its first emit waits for self.cond, i.e. until the response is queued
        if self.broken == "events-before-response":
            self.cond.wait_for(lambda: task.n > 0 or task_id not in self.tasks)
        return {"accepted": True, "task_id": task_id, "runtime_session_id": task.rsid}

    def _task(self, task_id: str) -> Task:
        task = self.tasks.get(task_id)
        if task is None:
            raise RpcError(-32008, f"no active task {task_id!r} in this worker")
        return task

    def _answer(self, p: dict[str, Any], answer: Answer) -> Any:
        task = self._task(p["task_id"])
        if p["tool_call_id"] not in task.pending:
            raise RpcError(-32009, f"task {task.task_id!r} has no pending tool call {p['tool_call_id']!r} "
                           "(unknown or already answered)")
        task.pending.discard(p["tool_call_id"])
        task.answers[p["tool_call_id"]] = answer
        self.cond.notify_all()
        return {"ok": True}

    def sendToolResult(self, p: dict[str, Any]) -> Any:
        return self._answer(p, Answer(False, p.get("result"), p.get("is_error", False)))

    def sendToolDenied(self, p: dict[str, Any]) -> Any:
        return self._answer(p, Answer(True, p.get("reason") or "denied"))

    def sendToolApproved(self, p: dict[str, Any]) -> Any:  # the scripted calls all run in the supervisor
        task = self._task(p["task_id"])
        raise RpcError(-32009, f"task {task.task_id!r} has no runtime-executed tool call {p['tool_call_id']!r}")

    def sendInput(self, p: dict[str, Any]) -> Any:  # §3.5b: this runtime cannot steer; every input is queued
        task = self._task(p["task_id"])
        given = p["input"]
        if isinstance(given, list) and all(isinstance(b, dict) and (
                (b.get("type") == "text" and isinstance(b.get("text"), str))
                or (b.get("type") == "code" and isinstance(b.get("code"), str))) for b in given):
            text = "".join(str(b.get("text", b.get("code"))) for b in given)
        elif isinstance(given, str):
            text = given
        else:
            raise RpcError(-32602, "Invalid params", {"errors": [{"loc": "input", "msg": "text or text/code blocks"}]})
        if not text.strip() or len(text) > 100_000:
            raise RpcError(-32602, "Invalid params", {"errors": [{"loc": "input", "msg": "some text, at most 100000"}]})
        if p["input_id"] in task.inputs:
            raise RpcError(-32602, f"input {p['input_id']!r} was sent to this task already")
        task.inputs.add(p["input_id"])
        return {"input_id": p["input_id"], "delivery": "queued"}

    def stop(self, p: dict[str, Any]) -> Any:
        task = self._task(p["task_id"])
        if task.stop_reason is None:  # §8: the first stop's reason is kept
            reason = p.get("reason")
            task.stop_reason = "stop requested" if reason is None else reason
        self.cond.notify_all()  # the scenarios honour a stop at once, so no forced cancellation is needed
        return {"ok": True}

    def finish(self) -> None:
        """§2.4: stop every task with reason "worker shutting down", flush the output, return (exit 0)."""
        with self.cond:
            tasks = list(self.tasks.values())
            for task in tasks:
                task.stop_reason = "worker shutting down"
            self.cond.notify_all()
        for task in tasks:
            task.thread.join(timeout=10)
        self.outgoing.put(None)
        self.writer.join()


def main(argv: list[str] | None = None) -> int:
    # §2.1: claim stdout first: fd 1 becomes stderr, protocol output goes to a private (non-inheritable) copy.
    out_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sys.set_int_max_str_digits(0)  # §1.3: the integer limit is the decoder's own (_int), not the interpreter's
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--max-frame-bytes", type=int,
                        default=int(os.environ.get("CODESDK_MAX_FRAME_BYTES", str(8 * 1024 * 1024))))
    parser.add_argument("--break", dest="broken", choices=BREAK_MODES, default=None)
    args = parser.parse_args(argv)
    if args.max_frame_bytes < 1024:
        parser.error("--max-frame-bytes must be at least 1024")
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s minimal-worker[%(process)d] %(levelname)s %(name)s: %(message)s")
    log.info("serving protocol %s (break mode: %s)", PROTOCOL_VERSION, args.broken)
    Worker(os.fdopen(out_fd, "wb"), args.max_frame_bytes, args.broken).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
