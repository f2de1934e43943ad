"""Questions: a runtime asks its user something; the question is recorded, asked, and answered exactly once.

A worker reports its runtime's question as ``question.requested`` (with the worker's own id for it). The
supervisor owns the record: the question gets an id of ours and a row in the store before anyone is asked, and is
streamed, so a UI following the session sees it. It is answered once — by the task's own answerer (a terminal, an
embedding app) or over the API — and the answer, checked against the question, is stored as ``question.answered``
and sent to the runtime (``runtime.sendAnswer``). Unanswered at its expiry, it settles by the operator's fallback
(decline, or each question's default answer); when its task ends first, it is declined with that reason, stored
just before the task's terminal event. A task nobody can be asked in (not interactive) declines every question at
once, saying why. Each question is routed when it is asked (``_audience``): when nobody can answer it the
operator's fallback applies at once (declined, saying why, or a shorter wait), and one still unanswered after
``--escalate-after`` is escalated once (``question.escalated``, stored before its answer).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

import trio

from codesdk.protocol import (
    AnsweredVia,
    Answers,
    EventType,
    InteractionMode,
    QuestionAnswered,
    QuestionEscalated,
    QuestionReply,
    QuestionRequested,
    QuestionState,
    Rpc,
    RuntimeInfo,
    SendAnswerParams,
    Trace,
    answer_problems,
    default_answers,
    duplicate_ids,
    redacted,
    utc_now,
)
from codesdk.worker.client import WorkerError

from ..ids import new_id
from ..store import EventDraft, QuestionRecord, QuestionSettled, Recorder
from ._audience import (
    QUESTION_KIND,
    Audience,
    Route,
    RoutingPolicy,
    Unattended,
    await_answer,
    expiry_reason,
    nobody_reason,
    route,
)
from ._recorder import RunRecorder
from ._runs import PendingEvent, TaskRun

log = logging.getLogger("codesdk.supervisor.questions")

#: Default seconds a question waits for its user before the operator's fallback answers it.
QUESTION_TIMEOUT_S = 15 * 60
#: ``answered_by`` of what nobody answered (refusal, fallback, the task's end).
BY_CODESDK = "codesdk"
#: ``answered_by`` of the task's own answerer (a terminal, an embedding app).
BY_ANSWERER = "answerer"

#: A task's own answerer: given the stored question, returns the reply (``InvalidAnswer``-checked like the API's).
Answerer = Callable[[QuestionRecord], Awaitable[QuestionReply]]

#: Questions of one task waiting at once: a runtime that asks more (a flood) has the rest declined, saying why.
MAX_OPEN_QUESTIONS = 16

NOT_INTERACTIVE = ("the task is not interactive: nobody can answer the runtime's question (start the task with "
                   "interaction_mode interactive to be asked)")


class QuestionFallback(StrEnum):
    """What an unanswered question becomes at its expiry (``--question-fallback``)."""

    DECLINE = "decline"
    DEFAULT = "default"  # each question's default answer; declined when a required one has none


@dataclass(frozen=True, slots=True)
class QuestionPolicy:
    timeout_s: float = QUESTION_TIMEOUT_S
    fallback: QuestionFallback = QuestionFallback.DECLINE


class InvalidAnswer(ValueError):
    """An answer its question does not allow: ``problems`` names each field (``answers.<id>``) and why."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(f"{field}: {why}" for field, why in self.problems))


class QuestionBroker:
    def __init__(self, store: Recorder, recorder: RunRecorder, policy: QuestionPolicy | None = None, *,
                 audience: Audience | None = None, routing: RoutingPolicy | None = None) -> None:
        self.store = store
        self.recorder = recorder
        self.policy = policy or QuestionPolicy()
        #: Who can answer (``_audience``), and the operator's routing (None: every question waits its timeout).
        self.audience = audience or Audience()
        self.routing = routing
        self._routes: dict[str, Route] = {}
        self._waiting: dict[str, trio.Event] = {}
        #: Answers as given (a secret one unredacted), until sent to the runtime: the store keeps them redacted.
        self._given: dict[str, Answers] = {}
        #: Questions waiting, per task.
        self._open: dict[str, int] = {}

    async def asked(self, run: TaskRun, asked: QuestionRequested) -> None:
        """A worker's ``question.requested``, in its order: recorded (or refused) here, never waiting for anyone;
        the wait for the answer runs in the task's tool nursery."""
        ask_id = asked.question_id
        if ask_id in run.asks_seen:  # sent again: asked once already
            log.warning("task %s: question %s asked again; the repeat is dropped", run.task_id, ask_id)
            return
        run.asks_seen.add(ask_id)
        question_id = new_id("qst")
        refusal = NOT_INTERACTIVE if run.params.interaction_mode != InteractionMode.INTERACTIVE else None
        if repeated := duplicate_ids(asked.questions):
            refusal = f"the runtime's question repeats the id(s) {repeated}: an answer could not say which it answers"
        elif refusal is None and self._open.get(run.task_id, 0) >= MAX_OPEN_QUESTIONS:
            refusal = f"the task has {MAX_OPEN_QUESTIONS} questions waiting already: answer those first"
        if refusal is not None:
            refused = QuestionAnswered(question_id=question_id, declined=True, reason=refusal,
                                       answered_via=AnsweredVia.REFUSED, answered_by=BY_CODESDK)
            if await self.recorder.append(run, [
                    PendingEvent(EventType.QUESTION_REQUESTED, asked.model_copy(update={
                        "question_id": question_id, "expires_at": None})),
                    PendingEvent(EventType.QUESTION_ANSWERED, refused)]):
                await _send(run, ask_id, declined=True, reason=refusal)
            return
        now = utc_now()
        own = run.answerer is not None
        routed = route(self.routing, own or self.audience.reachable(run.namespace, QUESTION_KIND),
                       self.policy.timeout_s, now, own=own)
        requested = asked.model_copy(update={"question_id": question_id,
                                             "expires_at": now + timedelta(seconds=routed.timeout_s)})
        assert requested.expires_at is not None
        self._routes[question_id] = routed  # before it is listed: a listing shows its routing
        try:
            record = await self.store.create_question(QuestionRecord(
                question_id=question_id, session_id=run.session_id, task_id=run.task_id, namespace=run.namespace,
                ask_id=ask_id, request=requested, state=QuestionState.PENDING, created_at=now,
                expires_at=requested.expires_at))
        except BaseException:
            self._routes.pop(question_id, None)
            raise
        if not await self.recorder.append(run, [PendingEvent(EventType.QUESTION_REQUESTED, requested)]) \
                or run.tools_nursery is None:
            self._routes.pop(question_id, None)
            await self._settle(record, QuestionState.DECLINED, AnsweredVia.TASK_END, BY_CODESDK, {},
                               "the task ended before the question was asked")
            return
        self._open[run.task_id] = self._open.get(run.task_id, 0) + 1
        run.tools_nursery.start_soon(self._wait, run, record, name=f"question:{question_id}")

    def route_of(self, question_id: str) -> Route | None:
        """How a pending question waiting here was routed when it was asked (None: not waiting here)."""
        return self._routes.get(question_id)

    async def _wait(self, run: TaskRun, record: QuestionRecord) -> None:
        """Wait for the answer (its answerer's, the API's, or the fallback at expiry), then store it as
        ``question.answered`` and tell the runtime. Cancelled by the task's end, which declines it instead."""
        question_id = record.question_id
        decided = trio.Event()
        self._waiting[question_id] = decided
        try:
            with run.clock.hold():  # the runtime waits for a human: its idle clock does not run
                current = await self.store.get_question(question_id)  # answered before the line above?
                routed = self._routes.get(question_id) or route(None, True, self.policy.timeout_s, record.created_at)
                if current.state == QuestionState.PENDING and routed.fallback is Unattended.DENY \
                        and self.routing is not None:
                    if await self.audience.wait_reachable(run.namespace, QUESTION_KIND, self.routing.attach_grace_s):
                        routed = self._routes[question_id] = route(self.routing, True, self.policy.timeout_s,
                                                                   record.created_at)
                    else:
                        current = await self._settle(current, QuestionState.DECLINED, AnsweredVia.FALLBACK,
                                                     BY_CODESDK, {}, nobody_reason(run.namespace, QUESTION_KIND,
                                                                                   self.routing))
                if current.state == QuestionState.PENDING:
                    if run.answerer is None:
                        routed = await await_answer(self.audience, run.namespace, QUESTION_KIND, routed, decided,
                                                    answerable=lambda: self._answerable(record),
                                                    escalate=lambda: self._escalate(run, record))
                    else:
                        with trio.move_on_after(routed.timeout_s):
                            await self._ask_answerer(run.answerer, current)
                    current = await self.store.get_question(question_id)
                if current.state == QuestionState.PENDING:
                    current = await self._fall_back(current, routed)
            given = self._given.pop(question_id, current.answers)
            if await self.recorder.append(run, [PendingEvent(EventType.QUESTION_ANSWERED, answered_event(current))]):
                await _send(run, current.ask_id, answers=given, declined=current.state == QuestionState.DECLINED,
                            reason=current.reason or "")
        finally:
            self._waiting.pop(question_id, None)
            self._given.pop(question_id, None)
            self._routes.pop(question_id, None)
            left = self._open.get(run.task_id, 1) - 1
            if left > 0:
                self._open[run.task_id] = left
            else:
                self._open.pop(run.task_id, None)

    async def _ask_answerer(self, answerer: Answerer, record: QuestionRecord) -> None:
        try:
            reply = await answerer(record)
            await self.answer(record.question_id, reply, BY_ANSWERER)
        except QuestionSettled:
            pass  # answered over the API meanwhile: the first answer stands
        except Exception as exc:  # the answerer broke or answered wrong: decline, never send a bad answer
            log.warning("answerer failed for %s: %s", record.question_id, exc)
            await self._settle(record, QuestionState.DECLINED, AnsweredVia.USER, BY_ANSWERER, {},
                               f"answering failed: {type(exc).__name__}: {exc}")

    async def _answerable(self, record: QuestionRecord) -> Route:
        """Someone can answer a question nobody could when it was asked: its whole timeout, from when it was
        asked."""
        routed = route(self.routing, True, self.policy.timeout_s, record.created_at)
        await self.store.extend_question(record.question_id,
                                         record.created_at + timedelta(seconds=routed.timeout_s))
        self._routes[record.question_id] = routed  # after the store: a listing never shows the old deadline
        return routed

    async def _escalate(self, run: TaskRun, record: QuestionRecord) -> None:
        """Record ``question.escalated`` (once: its wait calls this once) if the question is still pending."""
        record = await self.store.get_question(record.question_id)  # its deadline as it is now (it may have moved)
        if record.state != QuestionState.PENDING:
            return
        escalated = QuestionEscalated(question_id=record.question_id, expires_at=record.expires_at,
                                      pending_s=max(0.0, (utc_now() - record.created_at).total_seconds()))
        await self.recorder.append(run, [PendingEvent(EventType.QUESTION_ESCALATED, escalated)])

    async def _fall_back(self, record: QuestionRecord, routed: Route) -> QuestionRecord:
        waited = expiry_reason(f"no answer within {routed.timeout_s:.0f} s", routed, self.audience,
                               record.namespace, QUESTION_KIND, self.routing)
        questions = record.request.questions
        if self.policy.fallback == QuestionFallback.DEFAULT:
            answers = default_answers(questions)
            if answers is not None:
                self._given[record.question_id] = answers
                return await self._settle(record, QuestionState.ANSWERED, AnsweredVia.FALLBACK, BY_CODESDK,
                                          redacted(questions, answers), f"{waited}: the default answers")
            return await self._settle(record, QuestionState.DECLINED, AnsweredVia.FALLBACK, BY_CODESDK, {},
                                      f"{waited}; declined (a question has no default answer)")
        return await self._settle(record, QuestionState.DECLINED, AnsweredVia.FALLBACK, BY_CODESDK, {},
                                  f"{waited}; declined")

    async def answer(self, question_id: str, reply: QuestionReply, answered_by: str) -> QuestionRecord:
        """Record a user's answer (``InvalidAnswer`` if its question does not allow it, ``QuestionSettled`` if it
        has one already) and wake the waiting question."""
        record = await self.store.get_question(question_id)
        questions = record.request.questions
        if not reply.decline and (problems := answer_problems(questions, reply.answers)):
            raise InvalidAnswer(problems)
        if reply.decline:
            settled = await self.store.settle_question(question_id, QuestionState.DECLINED, AnsweredVia.USER,
                                                       answered_by, {}, reply.reason or "declined by the user")
        else:
            settled = await self.store.settle_question(question_id, QuestionState.ANSWERED, AnsweredVia.USER,
                                                       answered_by, redacted(questions, reply.answers), reply.reason)
            self._given[question_id] = dict(reply.answers)
        waiting = self._waiting.get(question_id)
        if waiting is not None:
            waiting.set()
        return settled

    async def _settle(self, record: QuestionRecord, state: QuestionState, via: AnsweredVia, by: str,
                      answers: Answers, reason: str) -> QuestionRecord:
        """Settle a question still pending; the final record either way."""
        try:
            return await self.store.settle_question(record.question_id, state, via, by, answers, reason)
        except QuestionSettled:
            return await self.store.get_question(record.question_id)

    async def close_for_end(self, run: TaskRun) -> list[EventDraft]:
        """The ``question.answered`` of each question of the task still open (asked, its answer not stored),
        stored with its terminal event: declined by the task's end unless it was answered just before."""
        ended = "stopped" if run.stop is not None else (run.terminal_type or "task.ended").removeprefix("task.")
        return await question_ends(self.store, run.session_id, run.task_id, run.runtime, run.trace,
                                   f"the task was {ended} before an answer")

    async def expire_orphans(self, namespace: str) -> int:
        """Questions left pending in a namespace taken over from a supervisor that is gone: nobody can send their
        answer (their task's worker went with it) — decline them."""
        orphans = await self.store.list_questions(state=QuestionState.PENDING, namespaces=[namespace])
        for record in orphans:
            await self._settle(record, QuestionState.DECLINED, AnsweredVia.TASK_END, BY_CODESDK,
                               {}, "the supervisor restarted before an answer; the task ended")
        return len(orphans)


async def question_ends(store: Recorder, session_id: str, task_id: str, runtime: RuntimeInfo, trace: Trace,
                        reason: str) -> list[EventDraft]:
    """The ``question.answered`` that closes each question of a task asked and not answered in its events: its
    row's answer if it has one (answered just before the end), else declined with ``reason``."""
    asked: dict[str, None] = {}
    after = 0
    while page := await store.read_types(session_id, _QUESTION_TYPES, after, 1000, task_id=task_id):
        after = page[-1].seq
        for event in page:
            payload = event.payload
            if isinstance(payload, QuestionRequested):
                asked[payload.question_id] = None
            elif isinstance(payload, QuestionAnswered):
                asked.pop(payload.question_id, None)
    drafts = []
    for question_id in asked:
        try:
            record = await store.settle_question(question_id, QuestionState.DECLINED, AnsweredVia.TASK_END,
                                                 BY_CODESDK, {}, reason)
        except QuestionSettled:
            record = await store.get_question(question_id)
        drafts.append(EventDraft(type=EventType.QUESTION_ANSWERED, runtime=runtime, payload=answered_event(record),
                                 trace=trace))
    return drafts


_QUESTION_TYPES = (EventType.QUESTION_REQUESTED, EventType.QUESTION_ANSWERED)


def answered_event(record: QuestionRecord) -> QuestionAnswered:
    """The ``question.answered`` of a settled question, from its row."""
    declined = record.state == QuestionState.DECLINED
    return QuestionAnswered(question_id=record.question_id, answers={} if declined else record.answers,
                            declined=declined, reason=record.reason or "",
                            answered_via=record.answered_via or AnsweredVia.TASK_END,
                            answered_by=record.answered_by or BY_CODESDK)


async def _send(run: TaskRun, ask_id: str, *, answers: Answers | None = None, declined: bool = False,
                reason: str = "") -> None:
    """Tell the runtime its answer (best effort: a worker that is gone fails the task anyway)."""
    if run.ended or run.worker is None:
        return
    try:
        await run.worker.connection.request(Rpc.SEND_ANSWER, SendAnswerParams(
            task_id=run.task_id, question_id=ask_id, answers=answers or {}, declined=declined, reason=reason))
    except WorkerError as exc:
        log.info("task %s: the answer to %s not delivered: %s", run.task_id, ask_id, exc)
