"""Human-readable rendering of events for the CLI: streamed text inline, one line per other event."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

from codesdk.protocol import (
    EventType,
    Message,
    ModelInput,
    NormalizedEvent,
    SessionBudget,
    StopReceipt,
    WorkerAnswer,
    api,
)

from ..terminal import one_line, printable

_DIM, _BOLD, _RED, _GREEN, _YELLOW, _RESET = "\033[2m", "\033[1m", "\033[31m", "\033[32m", "\033[33m", "\033[0m"
#: Our own colour codes: the only escape sequences a printed line may carry as they are.
_OURS = re.compile("(" + "|".join(re.escape(code) for code in (_DIM, _BOLD, _RED, _GREEN, _YELLOW, _RESET)) + ")")


def _printable_line(line: str) -> str:
    """A line we composed: the stored text in it made printable, our own colour codes kept."""
    return "".join(part if index % 2 else printable(part) for index, part in enumerate(_OURS.split(line)))


def _short(value: Any, limit: int = 120) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 1] + "…"


class EventPrinter:
    """Prints events as they come. Deltas stream inline; everything else gets its own line."""

    def __init__(self, out: TextIO, color: bool = False) -> None:
        self.out = out
        self.color = color
        self._mid_line = False

    def _c(self, code: str, text: str) -> str:
        return f"{code}{text}{_RESET}" if self.color else text

    def _line(self, text: str) -> None:
        if self._mid_line:
            self.out.write("\n")
            self._mid_line = False
        self.out.write(_printable_line(text) + "\n")
        self.out.flush()

    def end_line(self) -> None:
        """Finish a line that streamed deltas left open."""
        if self._mid_line:
            self.out.write("\n")
            self.out.flush()
            self._mid_line = False

    def note(self, text: str) -> None:
        self._line(self._c(_DIM, text))

    def print(self, event: NormalizedEvent) -> None:
        p = event.payload
        t = event.type
        if t == EventType.MODEL_OUTPUT_DELTA:
            if not self._mid_line:
                kind = getattr(p, "kind", "text")
                self.out.write(self._c(_DIM, f"{event.seq:>4}  ") + ("" if kind == "text" else f"[{kind}] "))
            delta = getattr(p, "delta", "")
            self.out.write(printable(delta))
            self._mid_line = not delta.endswith("\n")
            self.out.flush()
            return
        self._line(f"{self._c(_DIM, f'{event.seq:>4}')}  {self._describe(event)}")

    def _describe(self, event: NormalizedEvent) -> str:
        p: Any = event.payload
        t = event.type
        name = self._c(_BOLD, t.value)
        match t:
            case EventType.SESSION_CREATED:
                return f"{name} runtime={p.runtime} namespace={p.namespace} workspace={p.workspace}"
            case EventType.TASK_STARTED:
                return f"{name} {p.task_id} mode={p.permission_mode} prompt={_short(p.prompt_preview, 60)}"
            case EventType.MODEL_INPUT:
                return f"{name} {_model_input(p)}"
            case EventType.MODEL_OUTPUT_COMPLETED:
                return self._c(_DIM, f"{t.value} {p.kind} block, {len(p.text)} chars")
            case EventType.TOOL_CALL_REQUESTED:
                shown = p.input if p.input is not None else f"<{p.input_ref}>"
                return f"{name} {p.tool_name} {_short(shown)} ({p.tool_call_id}, attempt {p.attempt})"
            case EventType.TOOL_CALL_POLICY_EVALUATED:
                return self._c(_DIM, f"{t.value} {p.source}: {p.decision} — {p.reason}")
            case EventType.APPROVAL_REQUESTED:
                return (f"{self._c(_YELLOW, t.value)} {p.approval_id}: {p.tool_name} ({p.tool_class}) "
                        f"{_short(p.input_preview, 80)} — {p.reason}; expires {p.expires_at:%H:%M:%S} UTC")
            case EventType.QUESTION_REQUESTED:
                asks = "; ".join(q.header or q.text for q in p.questions)
                when = f"; expires {p.expires_at:%H:%M:%S} UTC" if p.expires_at is not None else ""
                return f"{self._c(_YELLOW, t.value)} {p.question_id}: {_short(p.message or asks, 80)}{when}"
            case EventType.QUESTION_ANSWERED:
                said = f"declined: {p.reason}" if p.declined else _short(p.answers, 80)
                return f"{self._c(_YELLOW if p.declined else _GREEN, t.value)} ({p.answered_via}) {said}"
            case EventType.TOOL_CALL_APPROVED:
                return f"{self._c(_GREEN, t.value)} {p.tool_call_id} ({p.source}) {p.reason}"
            case EventType.TOOL_CALL_DENIED:
                return f"{self._c(_YELLOW, t.value)} {p.tool_call_id} ({p.source}): {p.reason}"
            case EventType.TOOL_CALL_STARTED:
                return self._c(_DIM, f"{t.value} {p.tool_name} in {p.execution_env}")
            case EventType.TOOL_CALL_COMPLETED:
                status = self._c(_RED, "error") if p.is_error else "ok"
                replay = " (replayed from the store)" if p.replayed else ""
                return f"{name} {p.tool_name} {status}{replay}: {_short(p.result_preview)}"
            case EventType.MODEL_INPUT_APPENDED:
                where = (f"before {p.before_request_id}" if p.before_request_id else "into the running turn") \
                    if p.delivery == "mid_turn" else "not taken: the session's next task carries it"
                return f"{self._c(_BOLD, t.value)} {p.input_id} {where}: {_short(p.text, 80)}"
            case EventType.USAGE_REPORTED:
                return f"{name} in={p.input_tokens} out={p.output_tokens} model={p.model}"
            case EventType.TASK_COMPLETED:
                return f"{self._c(_GREEN, t.value)} ({p.stop_reason})"
            case EventType.TASK_FAILED:
                retry = " — retryable" if p.retryable else ""
                return f"{self._c(_RED, t.value)} {p.code}: {p.message}{retry}"
            case EventType.TASK_STOPPED:
                receipt = f" — {describe_receipt(p.receipt)}" if p.receipt is not None else ""
                return f"{self._c(_YELLOW, t.value)} {p.reason}{receipt}"
            case EventType.BUDGET_REACHED:
                return (f"{self._c(_YELLOW, t.value)} the {p.scope}'s {p.limit} limit ({p.limit_value:g}): "
                        f"{p.spent.amount(p.limit):g} spent; the session pauses until its budget is raised "
                        f"(codesdk budget {event.trace.session_id} --raise)")
            case EventType.BUDGET_RAISED:
                return f"{self._c(_GREEN, t.value)} by {p.raised_by}: {_short(p.limits.to_json_obj())}"
            case EventType.GRANT_CREATED:
                pattern = f" where {_short(p.pattern.to_json_obj())}" if p.pattern is not None else ""
                return (f"{self._c(_YELLOW, t.value)} {p.grant_id}: {p.decision} {p.tool_name} for the {p.scope}"
                        f"{pattern} (by {p.created_by or '?'})")
            case EventType.APPROVAL_ESCALATED:
                return (f"{self._c(_YELLOW, t.value)} {p.approval_id}: {p.tool_name} still waiting after "
                        f"{p.pending_s:.0f} s; expires {p.expires_at:%H:%M:%S} UTC")
            case EventType.QUESTION_ESCALATED:
                return (f"{self._c(_YELLOW, t.value)} {p.question_id}: still unanswered after {p.pending_s:.0f} s; "
                        f"expires {p.expires_at:%H:%M:%S} UTC")
            case EventType.GRANT_REVOKED:
                return f"{self._c(_YELLOW, t.value)} {p.grant_id} by {p.revoked_by or '?'}"
            case _:
                return self._c(_DIM, f"{t.value} {_short(p.to_json_obj())}")


def print_transcript(messages: list[Message], out: TextIO, as_json: bool = False) -> None:
    """One line per block: ``role: text``; other blocks as ``[type] {json}``. JSON lines with ``as_json``."""
    for message in messages:
        if as_json:
            out.write(json.dumps(message.to_json_obj(), ensure_ascii=False, separators=(",", ":")) + "\n")
            continue
        for block in message.blocks:
            body = block.to_json_obj()
            body.pop("type")
            if block.type in ("text", "code"):
                text = body.get("text") or body.get("code", "")
            else:
                text = f"[{block.type}] " + json.dumps(body, ensure_ascii=False)[:300]
            out.write(f"{message.role.value:>9}: {printable(text)}\n")
    out.flush()


def json_line(obj: dict[str, Any] | list[Any], out: TextIO | None = None) -> None:
    """One JSON value as one compact line, flushed (the CLI's --json output)."""
    out = out or sys.stdout
    out.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")
    out.flush()


def isolation_note(level: api.IsolationLevel) -> str:
    """A session's isolation level in a listing, when it is not the default one."""
    return "" if level == api.IsolationLevel.NAMESPACED else f" isolation={level.value}"


def budget_note(budget: SessionBudget | None) -> str:
    """`` budget=paused`` in a listing while a session waits for its budget to be raised."""
    return " budget=paused" if budget is not None and budget.paused is not None else ""


def session_line(session: api.Session) -> str:
    """A session in a line, as ``codesdk sessions`` lists it through the API: its id first (what a script cuts), its
    title, free text, last."""
    title = f"  {one_line(session.title)}" if session.title else ""
    return (f"{session.session_id}  {session.created_at.isoformat()[:19]}  {session.runtime:<9} "
            f"{session.namespace:<16} events={session.last_seq} state={session.state.value}"
            f"{isolation_note(session.isolation)}{budget_note(session.budget)}{title}")


def deleted_line(deleted: api.DeletedSession) -> str:
    """What deleting a session removed, in a line."""
    workspace = "workspace removed" if deleted.workspace_removed else "workspace kept"
    return (f"{deleted.session_id} deleted: {deleted.events} events, {deleted.stored_bytes} bytes, {deleted.blobs} "
            f"blobs, {workspace}")


ReadPage = Callable[[int, int], Awaitable[list[NormalizedEvent]]]
PAGE = 500


async def print_stored_events(read_page: ReadPage, after_seq: int, as_json: bool, printer: EventPrinter) -> None:
    """Every stored event after ``after_seq``, page by page (from the store or through the API alike)."""
    while True:
        page = await read_page(after_seq, PAGE)
        for event in page:
            json_line(event.to_json_obj()) if as_json else printer.print(event)
        if len(page) < PAGE:
            break
        after_seq = page[-1].seq
    if not as_json:
        printer.end_line()


def _model_input(p: ModelInput) -> str:
    """How many messages, how the runtime got the earlier turns, and what the budget left out."""
    parts = [f"{p.message_count} message(s)"]
    if p.resume is not None:
        parts.append(p.resume.value if p.switched_from is None else f"{p.resume.value} from {p.switched_from}")
    if p.interrupted_calls:
        parts.append(f"{len(p.interrupted_calls)} interrupted call(s) answered as such")
    if p.context is not None and p.context.omitted:
        parts.append(f"left out to fit {p.context.budget_tokens} tokens: {len(p.context.omitted_turns)} turn(s), "
                     f"{len(p.context.shrunk_outputs)} large output(s)")
    parts.append(f"{len(p.tool_names)} tool(s), {p.input_hash[:19]}…")
    return ", ".join(parts)


def describe_receipt(receipt: StopReceipt) -> str:
    """A stop's receipt in a line: the worker's answer, the interrupt and whether it was honoured, each process as
    it ended and whether it is gone, the calls in flight and how they ended."""
    parts: list[str] = []
    if receipt.worker is not None and receipt.worker != WorkerAnswer.CONFIRMED:
        parts.append(receipt.worker_detail or f"worker: {receipt.worker.value}")
    if receipt.interrupt_sent:
        grace = f" within {receipt.grace_s:g} s" if receipt.grace_s is not None else ""
        parts.append("interrupt sent, " + (f"runtime stopped by itself{grace}" if receipt.acknowledged
                                           else f"runtime did not stop{grace}: cancelled by force"))
    if receipt.runtime_ended_as:
        parts.append(f"the runtime had ended already ({receipt.runtime_ended_as})")
    for process in receipt.processes:
        ended = (f"SIGTERM, SIGKILL: {process.exit}" if process.kill_sent else f"SIGTERM: {process.exit}"
                 if process.term_sent else f"ended by itself ({process.exit})")
        parts.append(f"{process.name} pid {process.pid} {ended}, "
                     + ("verified gone" if process.gone else "NOT verified gone"))
    if receipt.tool_calls:
        parts.append("calls in flight: " + ", ".join(f"{c.tool_name} {c.ended.value}" for c in receipt.tool_calls))
    if receipt.duration_ms is not None:
        parts.append(f"{receipt.duration_ms / 1000:.2f} s")
    return "; ".join(parts) or "nothing was running"


def print_runtime_env(view: api.RuntimeEnvView, out: TextIO) -> None:
    """The runtime-env view for people: the worker, its folders, its variables' names, each runtime's sources."""
    env = view.env
    out.write(f"namespace {view.namespace}: isolation {env.isolation} ({env.mode}), worker pid {view.worker_pid}, "
              f"uid {view.uid}, gid {view.gid}\n")
    for name, value in (("HOME", env.home), ("XDG_CONFIG_HOME", env.xdg_config_home),
                        ("XDG_STATE_HOME", env.xdg_state_home), ("XDG_CACHE_HOME", env.xdg_cache_home),
                        ("XDG_DATA_HOME", env.xdg_data_home), ("TMPDIR", env.tmpdir), ("PATH", env.path),
                        ("cwd", view.cwd)):
        out.write(f"  {name:<16}{one_line(value) if value else '-'}\n")
    names = ", ".join(one_line(n) for n in env.variable_names)
    out.write(f"  variables ({len(env.variable_names)}, values never shown): {names or 'none'}\n")
    out.write(f"project files looked for in: {one_line(view.workspace)}\n" if view.workspace else
              "project files: not looked for (name a session with --session to look in its workspace)\n")
    for runtime in view.runtimes:
        out.write(f"{runtime.runtime}: {one_line(runtime.policy)}\n")
        for source in runtime.found:
            state = "loaded" if source.used else "off"
            out.write(f"  {state:<7}{source.kind:<24}{one_line(source.path)}\n")
        if not runtime.found:
            out.write("  nothing of its own found\n")


def print_budget(view: api.SessionBudgetView) -> None:
    """A session's budget, one ``key<TAB>value`` line each: its limits, what it spent, whether it is paused."""
    limits, spent = view.limits, view.spent

    def of(value: float | None, shown: str) -> str:
        return "no limit" if value is None else shown

    print(f"tokens\t{spent.tokens} of {of(limits.tokens, str(limits.tokens))}")
    cost = f"${spent.cost_usd:.4f}" + (f" (+{spent.unpriced_reports} unpriced reports)" if spent.unpriced_reports
                                       else "")
    print(f"cost_usd\t{cost} of {of(limits.cost_usd, f'${limits.cost_usd or 0:.4f}')}")
    print(f"tool_calls\t{spent.tool_calls} of {of(limits.tool_calls, str(limits.tool_calls))}")
    if view.paused is not None:
        reached = view.paused
        # a task's limit is the stopped task's own: a plain raise goes on; a session's limit must be raised above it
        more = f" --{_flag(reached.limit.value)} N" if reached.scope.value == "session" else ""
        print(f"paused\tthe {reached.scope.value}'s {reached.limit.value} limit ({reached.limit_value:g}) was reached "
              f"by task {reached.task_id}; go on with: codesdk budget {view.session_id} --raise{more}")
    else:
        print("paused\tno")


def _flag(limit: str) -> str:
    return {"cost_usd": "usd", "tool_calls": "tool-calls"}.get(limit, limit)
