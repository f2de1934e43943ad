"""The HTTP API's typed models: what a client sends and what the service answers, one set for both.

The service validates requests with these models and builds every JSON answer from them; the client parses the
answers back into them; the OpenAPI document is generated from them. They depend on the contract (events, runtime
offers, receipts, transcripts) and on nothing of the service's: the store's rows are mapped to them in one place
(``supervisor/api/views.py``).

Requests refuse unknown fields and take types strictly (``"allow": "yes"`` is not a boolean). Answers ignore fields
they do not know, so a client keeps working against a newer service that added some.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from ._base import Model
from ._budgets import MAX_LIMIT, BudgetLimits, BudgetReached, BudgetSpent, SessionBudget
from ._events import ApprovalState, BlockKind, EventType, NormalizedEvent
from ._events import ForkPoint as ForkPoint  # a Session's forked_from: part of this module's vocabulary
from ._grants import GrantDecision, GrantPattern, GrantScope
from ._jsonrpc import EnsureLoginResult, RuntimeOffer, RuntimeSources
from ._questions import MAX_QUESTIONS, AnsweredVia, AnswerValue, Question, QuestionSource, QuestionState
from ._receipt import StopReceipt
from ._steering import MAX_INPUT_CHARS, InputBlock, InputDelivery, input_text
from ._runtime import RUNTIME_NAME_PATTERN, InteractionMode, PermissionMode, RuntimeEnv
from ._webhooks import DELIVERY_ID_PATTERN
from ._runtime import IsolationLevel as IsolationLevel  # a Session's isolation: part of this module's vocabulary
from ._transcript import CodeBlock, Message, TextBlock
from ._webhooks import DeliveryState

#: The most a page of events, sessions or approvals holds.
MAX_PAGE = 1000
#: Largest seq/offset a client may name: stored integers are 64-bit signed.
MAX_SEQ = 2**63 - 1


class TaskState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def terminal_event(self) -> EventType | None:
        """The event type that ends a task in this state (``task.completed`` for COMPLETED ...)."""
        return EventType(f"task.{self.value}") if self.is_terminal else None


TERMINAL_STATES = frozenset({TaskState.COMPLETED, TaskState.FAILED, TaskState.STOPPED})


class SessionState(StrEnum):
    IDLE = "idle"
    """No task pending or running: a prompt may be sent."""
    BUSY = "busy"
    """A task is pending or running (``active_task_id``)."""
    ARCHIVED = "archived"
    """Kept, readable and usable, but left out of listings unless asked for."""


class SessionFilter(StrEnum):
    """Which sessions a listing holds, by state."""
    LIVE = "live"
    """Not archived (idle or busy): the default."""
    IDLE = "idle"
    BUSY = "busy"
    ARCHIVED = "archived"
    ALL = "all"


class GrantState(StrEnum):
    ACTIVE = "active"
    REVOKED = "revoked"


class ForkWorkspace(StrEnum):
    SHARED = "shared"
    """The fork works in the same directory as the session it came from (as a runtime's own fork does)."""
    NEW = "new"
    """The fork gets an empty workspace of its own."""


#: The longest title a session takes, in characters; and what a title may not hold (a NUL: no store keeps one).
MAX_TITLE = 200
TITLE_PATTERN = r"^[^\x00]*$"
#: The most a session's metadata takes, as compact JSON (UTF-8 bytes): metadata is kept with the session's row.
MAX_METADATA_BYTES = 64 * 1024


def _small_metadata(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is not None:
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode())
        if size > MAX_METADATA_BYTES:
            raise ValueError(f"metadata is {size} bytes as JSON; a session's takes at most {MAX_METADATA_BYTES}")
    return value


Metadata = Annotated[dict[str, Any], AfterValidator(_small_metadata)]
Title = Annotated[str, Field(min_length=1, max_length=MAX_TITLE, pattern=TITLE_PATTERN)]


# -- requests -----------------------------------------------------------------------------------------

class Request(BaseModel):
    """A request body: unknown fields refused, and strict types: ``"allow": "yes"`` or ``1`` is not a boolean, nor
    ``"5"`` an integer (enum fields, named by their value, say ``strict=False``)."""
    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True)


_QUERY_INT = re.compile(r"0|[1-9][0-9]{0,18}")
_QUERY_BOOL = {"true": True, "false": False}


class Query(Request):
    """A query string, as strict as a body: an integer field takes only decimal digits (no sign, space, ``_``,
    ``5.0`` or ``1e2``), a boolean only ``true`` or ``false``; anything else is refused as it is."""

    @model_validator(mode="before")
    @classmethod
    def _typed(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        typed = dict(data)
        for name, value in data.items():
            field = cls.model_fields.get(name)
            if field is None or not isinstance(value, str):
                continue
            kinds = {field.annotation} | set(getattr(field.annotation, "__args__", ()))
            if int in kinds and _QUERY_INT.fullmatch(value):
                typed[name] = int(value)
            elif bool in kinds and value in _QUERY_BOOL:
                typed[name] = _QUERY_BOOL[value]
        return typed


class BudgetLimitsRequest(Request):
    """Limits of a budget (absent or ``null``: none of that kind). Reached at or above the limit: the task stops
    (``task.stopped`` reason ``budget_reached``) and the session pauses until its budget is raised."""
    tokens: int | None = Field(default=None, ge=0, le=MAX_LIMIT)
    """Input plus output tokens, as the runtime reports them."""
    cost_usd: float | None = Field(default=None, ge=0, le=MAX_LIMIT, allow_inf_nan=False)
    """USD: the runtime's reported cost, else the operator's price for the model (``serve --price-table``)."""
    tool_calls: int | None = Field(default=None, ge=0, le=MAX_LIMIT)
    """Tool calls that may run: the next one stops the task before it runs."""

    def limits(self) -> BudgetLimits:
        return BudgetLimits(tokens=self.tokens, cost_usd=self.cost_usd, tool_calls=self.tool_calls)


class CreateSessionRequest(Request):
    namespace: str = Field(min_length=1)
    runtime: str | None = Field(default=None, min_length=1, max_length=64, pattern=RUNTIME_NAME_PATTERN)
    workspace: str | None = None
    """The session's workspace directory on the service's host (admin token only; default: one of its own)."""
    metadata: Metadata = Field(default_factory=dict)
    title: Title | None = None
    """For people (listings search it with ``q``)."""
    isolation: IsolationLevel = Field(default=IsolationLevel.NAMESPACED, strict=False)
    """Where the runtime's HOME is: the namespace's (``namespaced``), one made for this session and removed with it
    (``ephemeral``: credentials only from the namespace's stored variables), or the service user's own (``shared``:
    namespace ``default`` of a single-user service only, 409 ``isolation_refused`` otherwise)."""
    budget: BudgetLimitsRequest | None = None
    """The session's budget: what all its tasks together may spend (docs/sessions.md, "Budgets")."""


class UpdateSessionRequest(Request):
    """Only the fields sent change."""
    title: Title | None = None
    """A new title; ``null`` removes it."""
    archived: bool | None = None
    """true: archive it (left out of listings, kept whole and usable); false: bring it back."""
    metadata: Metadata | None = None
    """Replaces the session's metadata."""


class ForkSessionRequest(Request):
    at_seq: int | None = Field(default=None, ge=1, le=MAX_SEQ)
    """The last event the fork keeps (default: the session's newest). It may not fall inside a task: a task's
    events are kept whole or not at all (the refusal names the seqs around it)."""
    title: Title | None = None
    metadata: Metadata | None = None
    """Default: the session's own."""
    workspace: ForkWorkspace = Field(default=ForkWorkspace.SHARED, strict=False)


class StartTaskRequest(Request):
    prompt: str = Field(min_length=1)
    permission_mode: PermissionMode = Field(default=PermissionMode.ASK, strict=False)
    interaction_mode: InteractionMode = Field(default=InteractionMode.NON_INTERACTIVE, strict=False)
    """``interactive``: calls the policy can't decide wait for a decision at /v1/approvals/{id} (durable; they
    expire to a denial). ``non_interactive`` (default): such calls are denied with a recorded reason."""
    runtime_config: dict[str, Any] = Field(default_factory=dict)
    runtime: str | None = Field(default=None, min_length=1, max_length=64, pattern=RUNTIME_NAME_PATTERN)
    """Move the session to this runtime from this task on: the runtime is given the session's transcript."""
    max_input_tokens: int | None = Field(default=None, ge=1, le=2**53)
    """A cap on the compiled input (estimated tokens), below the runtime's own budget."""
    timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Wall-clock seconds from the task's start (absent: the operator's default; above its maximum: 422). Past it
    the task is stopped and fails ``task_timeout``."""
    idle_timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """The longest the runtime may send nothing, in seconds (paused while a tool call waits on the service)."""
    budget: BudgetLimitsRequest | None = None
    """This task's own budget (besides its session's)."""


class SetBudgetRequest(Request):
    limits: BudgetLimitsRequest
    """The session's limits from now on (replacing its own; a paused session stays paused: raise it instead)."""


class RaiseBudgetRequest(Request):
    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True, populate_by_name=True)
    limits: BudgetLimitsRequest = Field(default_factory=BudgetLimitsRequest)
    """New session limits, each replacing the session's of its kind (a limit the session reached must be raised
    above what it spent: 422)."""
    continue_: bool = Field(default=False, alias="continue")
    """Start a task at once that goes on with the work (the stopped task's modes and runtime config)."""
    task_budget: BudgetLimitsRequest | None = None
    """The continuing task's own budget."""
    prompt: str | None = Field(default=None, min_length=1)
    """The continuing task's prompt (default: continue where the stopped task left off)."""


class NamespaceBudgetRequest(Request):
    monthly_usd: float | None = Field(ge=0, le=1e12, allow_inf_nan=False)
    """The namespace's budget per calendar month (UTC) in USD; ``null``: none."""


class DecisionRequest(Request):
    allow: bool
    reason: str = Field(default="", max_length=1000)
    scope: GrantScope = Field(default=GrantScope.ONCE, strict=False)
    """How far the answer reaches: ``once`` (this call), ``task`` (this tool for the rest of the task),
    ``session`` (this tool for the session) or ``rule`` (this tool, for the session, where ``pattern`` matches).
    Every scope but ``once`` becomes a grant (docs/sessions.md, "Scoped grants")."""
    pattern: GrantPattern | None = Field(default=None, validate_default=True)
    """With scope ``rule`` (only): ``{"kind": "path", "prefix": "src"}``, ``{"kind": "command", "argv": ["git",
    "status"]}`` or ``{"kind": "host", "host": "docs.python.org"}``."""
    input: dict[str, Any] | None = Field(default=None, validate_default=True)
    """With an allow: the input the call runs with instead (validated like any input of the tool)."""

    @field_validator("pattern")
    @classmethod
    def _pattern_for_rule(cls, value: Any, info: ValidationInfo) -> Any:
        scope = info.data.get("scope")
        if scope is GrantScope.RULE and value is None:
            raise ValueError("scope 'rule' needs a pattern (kind path, command or host)")
        if value is not None and scope is not None and scope is not GrantScope.RULE:
            raise ValueError(f"a pattern goes with scope 'rule', not {scope.value!r}")
        return value

    @field_validator("input")
    @classmethod
    def _input_on_allow(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and info.data.get("allow") is False:
            raise ValueError("an edited input goes with an allow; a denial runs nothing")
        return value


class ApprovalDecision(DecisionRequest):
    """One decision of a batch: which approval, and the decision as ``POST /v1/approvals/{id}`` takes it."""
    approval_id: str = Field(min_length=1, max_length=128)


class DecisionsRequest(Request):
    decisions: list[ApprovalDecision] = Field(min_length=1, max_length=100)
    """Each applied on its own: one that cannot be (unknown, already decided, invalid for its call) does not
    keep the others from being applied."""


class StopTaskRequest(Request):
    reason: str = Field(default="stop requested via API", min_length=1, max_length=1000)


class TaskInputRequest(Request):
    """A user's message into a running task (steering)."""
    input: str | list[InputBlock]
    """The message: text, or text/code blocks as a task's messages hold them (at most 100 000 characters)."""
    input_id: str | None = Field(default=None, min_length=1, max_length=200, pattern=r"^[!-~]+$")
    """Your name for it, unique in the session (absent: the service makes one); the event that records its
    delivery carries it."""

    @field_validator("input", mode="wrap")
    @classmethod
    def _has_text(cls, value: object, handler: ValidatorFunctionWrapHandler) -> str | list[TextBlock | CodeBlock]:
        try:
            value = handler(value)
        except ValidationError as exc:  # one sentence, not one per branch of the union
            where = next((".".join(map(str, e["loc"][1:])) for e in exc.errors() if len(e["loc"]) > 1
                          and not isinstance(value, str)), "")
            raise ValueError("must be text, or a list of blocks {\"type\": \"text\", \"text\": …} / {\"type\": "
                             "\"code\", \"code\": …}" + (f" (block {where})" if where else "")) from None
        assert isinstance(value, (str, list))
        text = input_text(value if isinstance(value, str) else tuple(value))
        if not text.strip():
            raise ValueError("an input must hold some text")
        if len(text) > MAX_INPUT_CHARS:
            raise ValueError(f"an input holds at most {MAX_INPUT_CHARS} characters (this one {len(text)})")
        return value


class EnvUpdateRequest(Request):
    set: dict[str, str] = Field(default_factory=dict)
    """Variables to set (values are never returned), and names to remove; one atomic change."""
    unset: list[str] = Field(default_factory=list)


class EgressUpdateRequest(Request):
    hosts: list[str] | None
    """The namespace's own host patterns for http.fetch (``example.com``, ``*.example.com``, an IP, each with an
    optional ``:PORT``), each within one of the operator's ``--allow-fetch``: it may then fetch only from hosts both
    allow. ``[]``: none at all; ``null``: drop the namespace's own list (the operator's applies as is)."""


class EventsQuery(Query):
    after_seq: int = Field(default=0, ge=0, le=MAX_SEQ)
    limit: int = Field(default=100, ge=1, le=MAX_PAGE)


class StreamQuery(Query):
    after_seq: int | None = Field(default=None, ge=0, le=MAX_SEQ)
    """Resume after this seq (the ``Last-Event-ID`` header, when sent, takes precedence)."""
    until_terminal: bool = False
    """End the stream after the session's next terminal task event."""


class SessionsQuery(Query):
    state: SessionFilter = Field(default=SessionFilter.LIVE, strict=False)
    """live (default: all but the archived), idle, busy, archived or all."""
    q: str | None = Field(default=None, min_length=1, max_length=MAX_TITLE, pattern=TITLE_PATTERN)
    """Only sessions whose title or one of whose prompts contains this text (ASCII letters in any case)."""
    namespace: str | None = None
    """One namespace of the token's (the admin's: any); default: all the token sees."""
    runtime: str | None = Field(default=None, min_length=1, max_length=64, pattern=RUNTIME_NAME_PATTERN)
    """Only sessions on this runtime."""
    after: str | None = Field(default=None, min_length=1, max_length=200)
    """A cursor: only sessions stored after this one (a page's ``next_after``)."""
    limit: int = Field(default=100, ge=1, le=MAX_PAGE)
    offset: int = Field(default=0, ge=0, le=MAX_SEQ)
    """Skip this many first (after ``after``, if given); a cursor stays right while sessions are added."""


class RuntimesQuery(Query):
    namespace: str | None = None
    """Default: the caller's own namespace (the one its token is bound to; the admin's: "default")."""


class RuntimeEnvQuery(Query):
    session_id: str | None = None
    """Look for project files (instructions, settings) in this session's workspace; it must be the namespace's.
    Without it only the user's own sources are listed."""


class NoQuery(Query):
    """A route that takes no query parameters: any is refused rather than ignored."""


class ApprovalsQuery(Query):
    state: str = "pending"
    """pending, approved, denied, expired or all."""


# -- answers ------------------------------------------------------------------------------------------

class Answer(Model):
    """A JSON answer of the service: fields it does not know are ignored (a newer service may add some); fields
    that are None are left out of the wire form."""
    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)


class ErrorInfo(Answer):
    code: str
    """Stable and machine-readable (``session_not_found``, ``quota_exceeded`` …): branch on it."""
    message: str
    """For people: what was refused and what to do about it."""
    details: dict[str, Any] | None = None
    """Structured facts some refusals carry (the quota and its fill, the namespace's owner …)."""


class ErrorAnswer(Answer):
    """Every answer with a status of 400 or more."""
    error: ErrorInfo


class Health(Answer):
    status: str


class Readiness(Answer):
    status: str
    details: dict[str, Any] | None = None
    """Why the service runs degraded while still ready (no resource groups …)."""


class Session(Answer):
    session_id: str
    runtime: str
    namespace: str
    workspace: str | None = None
    created_at: datetime
    metadata: dict[str, Any] = Field(default_factory=dict)
    runtime_session_id: str | None = None
    """The runtime's own id of the conversation (what it resumes by), once it said one."""
    last_seq: int = Field(default=0, ge=0)
    """The seq of the session's newest stored event."""
    title: str | None = None
    state: SessionState = SessionState.IDLE
    active_task_id: str | None = None
    """The task pending or running, if any (a session runs one at a time)."""
    archived_at: datetime | None = None
    forked_from: ForkPoint | None = None
    """A fork's origin: its events up to that seq are copies of that session's (their task ids are its tasks')."""
    isolation: IsolationLevel = IsolationLevel.NAMESPACED
    """Where its runtime's HOME is (``namespaced``, ``ephemeral``, ``shared``): chosen when it was created, kept by
    its forks."""
    budget: SessionBudget | None = None
    """Its budget: limits, what it spent, and ``paused`` (what was reached) while it waits for a raise."""


class SessionBudgetView(Answer):
    """A session's budget, and the raise it waits for while paused."""
    session_id: str
    limits: BudgetLimits = Field(default_factory=BudgetLimits)
    spent: BudgetSpent = Field(default_factory=BudgetSpent)
    paused: BudgetReached | None = None
    """Set while paused: the limit reached. A new task is refused (409 ``budget_paused``) until it is raised."""
    paused_at: datetime | None = None
    raise_pending: bool = False
    """A raise is asked for (``POST .../budget/raise``): the session is paused."""


class RaisedBudget(SessionBudgetView):
    task: Task | None = None
    """The task started to go on with the work (``continue``)."""


class NamespaceBudget(Answer):
    """A namespace's monthly budget and what it spent this month (UTC)."""
    namespace: str
    monthly_usd: float | None = None
    """None: no monthly budget."""
    month: str
    """``YYYY-MM``."""
    spent: BudgetSpent
    resets_at: datetime
    """When this month's spend starts again from 0."""


class DeletedSession(Answer):
    """What deleting a session removed."""
    session_id: str
    events: int = Field(ge=0)
    stored_bytes: int = Field(ge=0)
    """What it counted against its namespace's quota: its events and the blobs they named."""
    blobs: int = Field(ge=0)
    """Blobs removed: those no other session held."""
    workspace_removed: bool
    """Its default workspace was removed (false: it had an operator's workspace, one a fork still uses, or none)."""


class SessionList(Answer):
    """One page of sessions, oldest first."""
    sessions: tuple[Session, ...]
    has_more: bool = False
    """More sessions follow this page: ask again with ``after`` = ``next_after``."""
    next_after: str | None = None
    """The cursor of the next page: the last session of this one."""


class Usage(Answer):
    """A task's usage: the sums of what its runtime reported (``usage.reported`` events)."""
    reports: int = Field(default=0, ge=0)
    """How many reports (a runtime reports once per model request, or once per task)."""
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cache_read_tokens: int = Field(default=0, ge=0)
    cache_write_tokens: int = Field(default=0, ge=0)
    reasoning_tokens: int = Field(default=0, ge=0)
    cost_usd: float | None = Field(default=None, ge=0)
    """The sum of the costs it reported; None: it reported none (most runtimes do not)."""


class OutputBlock(Answer):
    kind: BlockKind
    text: str
    language: str | None = None


class TaskResult(Answer):
    """What an ended task came to, from its stored events."""
    stop_reason: str | None = None
    """Why a completed task's runtime stopped (``end_turn`` …)."""
    output: tuple[OutputBlock, ...] = ()
    """Its final answer: the text and code blocks the runtime gave after its last tool call."""
    text: str = ""
    """Those blocks' text, one after the other."""
    tool_calls: int = Field(default=0, ge=0)
    usage: Usage = Field(default_factory=Usage)
    duration_ms: float | None = Field(default=None, ge=0)
    """From its start to its end."""


class Task(Answer):
    task_id: str
    session_id: str
    state: TaskState
    runtime: str
    created_at: datetime
    started_at: datetime | None = None
    ended_at: datetime | None = None
    worker_pid: int | None = None
    terminal_type: str | None = None
    """The event type that ended it (``task.completed`` …)."""
    error: dict[str, Any] | None = None
    """A failed task's error (``code``, ``message``, ``retryable`` …)."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    result: TaskResult | None = None
    """Once it has ended (``GET /v1/tasks/{id}``, a stop's answer): its final answer, tool calls and usage."""


class TaskInput(Answer):
    """An input the task's runtime took: now, into the running turn (``mid_turn``), or for its next turn
    (``queued``: the session's next task, if this one ends first). ``model.input.appended`` records its delivery."""
    task_id: str
    input_id: str
    delivery: InputDelivery


class StoppedTask(Task):
    receipt: StopReceipt | None = None
    """What the stop did and verified; None when the task had ended otherwise before the stop took."""


class UnattendedFallback(StrEnum):
    """What an approval or question nobody could answer got when it opened (``serve --unattended``)."""
    DENY = "deny"
    WAIT = "wait"


class Routing(Answer):
    """Who could answer a pending approval or question, and what happens if nobody does (docs/sessions.md,
    "Who is asked")."""
    answerable: bool
    """Someone could answer it now: a client following its namespace's events, its task's own approver or answerer,
    or a webhook taking its ``*.requested`` kind there."""
    streams: int = 0
    """Event streams following its namespace on this supervisor now."""
    consoles: int = 0
    """Web consoles active now (polled within the last 30 s) whose token may see its namespace, on this supervisor."""
    webhook: bool = False
    """A webhook in its namespace takes its ``approval.requested`` / ``question.requested``."""
    fallback: UnattendedFallback | None = None
    """The operator's fallback that applied when it opened because nobody could answer then (``wait``: its
    ``expires_at`` is the shorter deadline until someone can answer, then its whole timeout again and this None);
    None: someone could, or routing is off."""
    escalates_at: datetime | None = None
    """When it is escalated (``approval.escalated`` / ``question.escalated``) if still pending; None: never."""


class Approval(Answer):
    """A tool call waiting for (or given) a person's decision."""
    approval_id: str
    session_id: str
    task_id: str
    namespace: str
    tool_call_id: str
    attempt: int
    tool_name: str
    tool_class: str
    input: dict[str, Any] = Field(default_factory=dict)
    reason: str
    state: ApprovalState
    created_at: datetime
    expires_at: datetime
    decided_at: datetime | None = None
    decided_by: str | None = None
    decision_reason: str | None = None
    routing: Routing | None = None
    """While pending: whether anyone could answer it, and when it escalates."""


class ApprovalList(Answer):
    approvals: tuple[Approval, ...]


class DecisionResult(Answer):
    """How one decision of a batch went: ``status`` as the single call would have answered (200, 404, 409, 422),
    with the approval as decided, or the error."""
    approval_id: str
    status: int
    approval: Approval | None = None
    error: dict[str, Any] | None = None


class DecisionResults(Answer):
    results: tuple[DecisionResult, ...]
    """In the order of the request's ``decisions``."""


class Grant(Answer):
    """A standing answer: it decides the session's calls it covers until revoked (docs/sessions.md)."""
    grant_id: str
    session_id: str
    scope: GrantScope
    decision: GrantDecision
    tool_name: str
    pattern: GrantPattern | None = None
    approval_id: str | None = None
    tool_call_id: str | None = None
    task_id: str | None = None
    """The one task a ``task`` grant is for."""
    created_by: str = ""
    created_at: datetime
    created_seq: int | None = None
    state: GrantState
    revoked_at: datetime | None = None
    revoked_by: str | None = None
    revoke_reason: str | None = None


class GrantList(Answer):
    grants: tuple[Grant, ...]


class EventPage(Answer):
    events: tuple[NormalizedEvent, ...]
    next_after_seq: int = Field(ge=0)
    """Ask for the next page with ``after_seq`` set to this."""
    has_more: bool


class Transcript(Answer):
    session_id: str
    messages: tuple[Message, ...]


class RuntimeList(Answer):
    namespace: str
    runtimes: tuple[RuntimeOffer, ...]


class NamespaceInfo(Answer):
    namespace: str
    sessions: int = Field(ge=0)


class NamespaceList(Answer):
    namespaces: tuple[NamespaceInfo, ...]


class Me(Answer):
    """Who the token is: what a client needs to choose a namespace without guessing (a tenant's only one; the
    admin's ``default``)."""
    #: the token's name (unique per namespace)
    name: str
    #: the admin: every namespace, the operator's routes
    admin: bool
    #: the namespaces a tenant's token is bound to (none for the admin: it may use any)
    namespaces: tuple[str, ...]


class LoginState(EnsureLoginResult):
    """A runtime's login in a namespace: what an operator must do so it can run there."""
    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)


class RuntimeEnvView(Answer):
    """What a namespace's worker really runs with: where its HOME and XDG folders are, which variables it gets
    (names only: a value is never shown), as whom it runs, and per runtime what it would load on its own."""
    namespace: str
    env: RuntimeEnv
    """The isolation level and mode, the folders, PATH and the names of every variable the worker gets."""
    worker_pid: int
    uid: int
    """The worker's user id (its namespace's own with a uid range; else the service's)."""
    gid: int
    cwd: str | None = None
    """The folder the worker starts in (its HOME)."""
    workspace: str | None = None
    """The session workspace looked in for project files (``session_id``), if any."""
    runtimes: tuple[RuntimeSources, ...]
    """Per runtime: CodeSDK's policy for what it loads on its own, and what was found (``used``: loaded)."""


class WorkerState(Answer):
    namespace: str
    state: str
    """idle, starting, running, backing_off, quarantined …"""
    pid: int | None = None
    active_tasks: int = Field(ge=0)
    workers_started: int = Field(ge=0)
    started_by: str | None = None
    recent_crashes: int = Field(ge=0)
    last_exit: str | None = None
    last_error: str | None = None
    quarantined_until: float | None = None
    """Unix time the quarantine ends."""
    quarantine_reason: str | None = None
    isolation: IsolationLevel = IsolationLevel.NAMESPACED
    """The worker's level: the namespace's own (``namespaced``), or one session's (``ephemeral``, with
    ``session_id``) or the shared level's, each a worker of its own."""
    session_id: str | None = None


class WorkerList(Answer):
    workers: tuple[WorkerState, ...]
    template: str
    """The worker template's state (``off`` when not configured)."""


class TokenInfo(Answer):
    """An API token as the admin sees it: never the token, nor its hash."""
    id: str
    name: str
    admin: bool = False
    metrics: bool = False
    """A metrics token: it reads /metrics and nothing else."""
    namespaces: tuple[str, ...] = ()


class TokenList(Answer):
    tokens: tuple[TokenInfo, ...]


class CreateTokenRequest(Request):
    name: str = Field(min_length=1, max_length=200, pattern=TITLE_PATTERN)
    namespaces: list[str] = Field(default_factory=list, max_length=100)
    """The namespaces it may use (one at least), unless ``metrics``."""
    metrics: bool = False
    """A token for Prometheus: /metrics and nothing else (no namespace)."""


class IssuedToken(Answer):
    """A token made or rotated: ``secret`` is the token itself, shown this once (only its hash is kept)."""
    token: TokenInfo
    secret: str


class QuarantineLifted(Answer):
    namespace: str
    lifted: bool
    """False: it was not quarantined."""


class EnvVariable(Answer):
    name: str
    fingerprint: str
    """Identifies the value without showing it."""


class NamespaceEgress(Answer):
    namespace: str
    operator_hosts: tuple[str, ...]
    """The operator's ``--allow-fetch`` patterns (none: http.fetch is off on this service)."""
    hosts: tuple[str, ...] | None = None
    """The namespace's own narrowing of them; absent when it has none."""


class EnvList(Answer):
    namespace: str
    variables: tuple[EnvVariable, ...]


# -- questions to the user ------------------------------------------------------------------------------------

class QuestionsQuery(Query):
    state: str = "pending"
    """pending, answered, declined or all."""


class AnswerRequest(Request):
    """The answer to a runtime's question: ``answers`` keyed by question id (each checked against its question:
    one of its choices, a list of them with ``multi_select``, text, or a value its schema allows), or
    ``decline: true`` (with a ``reason`` the runtime is told)."""
    answers: dict[str, AnswerValue] = Field(default_factory=dict, max_length=MAX_QUESTIONS)
    decline: bool = False
    reason: str = Field(default="", max_length=2000)

    @model_validator(mode="after")
    def _answers_or_decline(self) -> AnswerRequest:
        if self.decline and self.answers:
            raise ValueError("give answers or decline: true, not both")
        return self


class AskedQuestion(Answer):
    """A runtime's question waiting for (or given) its user's answer (a secret answer shown as ``[secret]``)."""
    question_id: str
    session_id: str
    task_id: str
    namespace: str
    source: QuestionSource
    message: str = ""
    origin: str = ""
    questions: tuple[Question, ...]
    state: QuestionState
    created_at: datetime
    expires_at: datetime
    answered_at: datetime | None = None
    answered_via: AnsweredVia | None = None
    answered_by: str | None = None
    answers: dict[str, AnswerValue] = Field(default_factory=dict)
    reason: str | None = None
    routing: Routing | None = None
    """While pending: whether anyone could answer it, and when it escalates."""


class AskedQuestionList(Answer):
    questions: tuple[AskedQuestion, ...]


# -- webhooks (docs/webhooks.md) -----------------------------------------------------------------------

#: The longest URL and description a webhook may have.
MAX_WEBHOOK_URL = 2048
MAX_WEBHOOK_DESCRIPTION = 500


class CreateWebhookRequest(Request):
    url: str = Field(min_length=1, max_length=MAX_WEBHOOK_URL)
    """An http or https URL on a host the operator allows (``serve --webhook-allow``)."""
    kinds: list[str] = Field(min_length=1, max_length=32)
    """The kinds to deliver (``*``: every kind); a test-send is always delivered."""
    namespace: str | None = None
    """The admin: one namespace, or none for every namespace. A tenant: its own (default: its only one)."""
    description: str = Field(default="", max_length=MAX_WEBHOOK_DESCRIPTION)


class RotateWebhookSecretRequest(Request):
    end_overlap: bool = False
    """Rotate although an earlier rotation's previous secret still signs: that secret stops signing now."""


class DeliveriesQuery(Query):
    state: str | None = None
    """pending, delivered or dead (absent: all)."""
    before: str | None = Field(default=None, pattern=DELIVERY_ID_PATTERN)
    """A cursor: only deliveries made before this one (a page's ``next_before``)."""
    limit: int = Field(default=100, ge=1, le=MAX_PAGE)


class Webhook(Answer):
    id: str
    url: str
    kinds: tuple[str, ...]
    namespace: str | None = None
    """None (absent): every namespace (the admin's)."""
    description: str = ""
    created_at: datetime
    disabled: bool = False


class WebhookCreated(Answer):
    webhook: Webhook
    secret: str
    """``whsec_…``: shown this once; the receiver verifies signatures with it."""


class WebhookList(Answer):
    webhooks: tuple[Webhook, ...]


class RotatedSecret(Answer):
    secret: str
    """The new ``whsec_…`` secret, shown this once."""
    previous_valid_until: datetime
    """Until then deliveries are signed with both secrets."""


class DeliveryAttempt(Answer):
    at: datetime
    status: int | None = None
    """The endpoint's HTTP status; None where no answer came."""
    error: str | None = None
    duration_ms: float


class Delivery(Answer):
    id: str
    """Also the ``webhook-id`` header: the same on every attempt (deduplicate on it)."""
    webhook_id: str
    kind: str
    namespace: str | None = None
    session_id: str | None = None
    task_id: str | None = None
    state: DeliveryState
    attempts: int | tuple[DeliveryAttempt, ...]
    """A count in listings; the attempts themselves when one delivery is read."""
    next_attempt_at: datetime | None = None
    last_error: str | None = None
    created_at: datetime
    delivered_at: datetime | None = None


class DeliveryAnswer(Answer):
    delivery: Delivery


class DeliveryList(Answer):
    """One page of a webhook's deliveries, newest first."""
    deliveries: tuple[Delivery, ...]
    has_more: bool = False
    """Older deliveries follow this page: ask again with ``before`` = ``next_before``."""
    next_before: str | None = None
    """The cursor of the next page: the last (oldest) delivery of this one."""
