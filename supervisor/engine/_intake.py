"""Events from workers: each checked against its task run, then stored, handed to the tool flow, or ending it.

Nothing a worker sends is taken on its word: an event for an unknown or ended task, a repeated ordinal, a
tool event for a call nobody approved is dropped and counted (``EngineStats``). What goes wrong with one event
ends its own task only; the rest of the batch goes on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import trio

from codesdk.protocol import (
    TERMINAL_EVENT_TYPES,
    CanonicalizationError,
    EventType,
    ModelInputAppended,
    ExitStatus,
    Model,
    RuntimeInfo,
    TaskFailed,
    TaskFailureCode,
    QuestionRequested,
    ToolCallRequested,
    UsageReported,
    WireEvent,
    canonical_json,
    sha256_hex,
)

from ..fair import FairTurns
from ..store import INLINE_BLOB_MAX, DatabaseError, PayloadJson, Recorder, StoreError
from ._batch import PendingBatch
from ._budgets import Budgets
from ._ending import TaskEnder
from ._ports import WorkerLink
from ._recorder import RunRecorder
from ._runs import Blobs, EngineStats, PendingEvent, RunTable, TaskRun
from ._steering import reported
from ._questions import QuestionBroker
from ._toolflow import ToolFlow

log = logging.getLogger("codesdk.supervisor.engine")

#: Events taken in one step of the event loop: a unit of several hundred events is checked in several steps, so
#: that another tenant's request waits for ~1 ms of it, not for the whole unit.
EVENTS_PER_STEP = 64

#: Tool events a worker may send only for runtime-executed calls the policy approved.
_RUNTIME_TOOL_EVENTS = frozenset({EventType.TOOL_CALL_STARTED, EventType.TOOL_OUTPUT_DELTA,
                                  EventType.TOOL_OUTPUT_COMPLETED, EventType.TOOL_CALL_COMPLETED})


class EventIntake:
    """The workers' two callbacks into the engine: ``on_events`` (a batch, in order) and ``on_exit``."""

    def __init__(self, store: Recorder, runs: RunTable, stats: EngineStats, recorder: RunRecorder,
                 tools: ToolFlow, ender: TaskEnder, questions: QuestionBroker,
                 turns: FairTurns | None = None, budgets: Budgets | None = None) -> None:
        #: every namespace's events take turns here (weighted deficit round robin): a flood slows its own namespace
        self.turns = turns if turns is not None else FairTurns()
        self._store = store
        self._runs = runs
        self._stats = stats
        self._recorder = recorder
        self._tools = tools
        self._ender = ender
        self._questions = questions
        self._budgets = budgets

    async def on_events(self, worker: WorkerLink, batch: Sequence[WireEvent]) -> None:
        """Store a worker's events in order, in turns fair across namespaces (``FairTurns``: while another
        namespace is active, a unit holds at most the namespace's quantum of events, a few quanta while it is
        alone; the rest waits its next turn, and the worker's further output waits in its own pipe meanwhile).
        Plain events wait in a ``PendingBatch``, one append per task, so a fast stream is group-committed; tool
        requests and terminal events are handled one by one, in place, once what came before them is stored."""
        key = self._namespace_of(worker, batch)
        start = 0
        while start < len(batch):
            others = self.turns.others_active(key)
            cap = self.turns.cap(key, others_active=others)
            unit = batch[start:start + cap]
            pending = PendingBatch(self._recorder, self._ender.lost_events,
                                   self.turns.pause_factor(key) if others else 0.0)
            done = 0
            async with self.turns.turn(key, len(unit)):
                for index, params in enumerate(unit):
                    if index and not index % EVENTS_PER_STEP:
                        if self.turns.others_waiting(key):  # end the turn here: the rest is a unit of its own
                            break
                        await trio.lowlevel.checkpoint()  # what is not a turn (a request, a read) runs meanwhile
                    run = self._accept(worker, params)
                    if run is not None:
                        await self._route(run, params, pending)
                    done = index + 1
                await pending.flush(linger=start + done >= len(batch))  # no more of the batch behind them
            start += done
            if pending.owed_pause_s > 0:  # a stream's share, taken outside its turn (``PendingBatch._share``)
                await trio.sleep(pending.owed_pause_s)

    def _namespace_of(self, worker: WorkerLink, batch: Sequence[WireEvent]) -> str:
        """Whose turns these events take: the namespace of the worker's runs (one worker per namespace)."""
        for params in batch:
            run = self._runs.find(params.task_id)
            if run is not None and run.worker is worker:
                return run.namespace
        return worker.spec.name

    async def on_exit(self, namespace: str, worker: WorkerLink, status: ExitStatus) -> None:
        """A worker is gone: it holds none of its tasks any more, and each still running fails WORKER_CRASHED."""
        for run in self._runs.every_run():
            if run.worker is worker:
                run.released.set()
                if run.stop is not None:  # its stop ends it, saying so
                    run.stop.worker_exited(status.describe())
        orphans = [r for r in self._runs.active_runs() if r.worker is worker and not r.ended and r.stop is None]
        if not orphans:
            return
        self._stats.worker_crashes += 1
        tail = worker.stderr.text()
        for run in orphans:  # each session holds the tail its failure names
            tail_ref = await self._store.put_blob(tail.encode("utf-8"), "text/plain; charset=utf-8",
                                                  session_id=run.session_id) if tail else None
            await self._ender.fail(run, TaskFailureCode.WORKER_CRASHED,
                                   f"the worker for namespace {namespace!r} {status.describe()} while the task was "
                                   "running", retryable=True, worker_pid=worker.pid, stderr_tail_ref=tail_ref,
                                   **status.to_json_obj())

    def _accept(self, worker: WorkerLink, params: WireEvent) -> TaskRun | None:
        """The run an event belongs to, or None (counted) if it is for an unknown or already ended task."""
        run = self._runs.find(params.task_id)
        if run is None or run.worker is not worker:
            self._stats.unknown_task_events += 1
            log.warning("%s: event %s for unknown task %r dropped", worker.spec.name, params.type, params.task_id)
            return None
        if params.n < run.next_n:  # sent again (a retried notification): it was handled already
            self._stats.duplicate_events += 1
            log.warning("task %s: event ordinal %d again (expected %d); the repeat is dropped", run.task_id,
                        params.n, run.next_n)
            return None
        if params.n != run.next_n:
            self._stats.ordinal_gaps += 1
            log.warning("task %s: event ordinal %d, expected %d", run.task_id, params.n, run.next_n)
        run.next_n = params.n + 1
        if params.type in TERMINAL_EVENT_TYPES:
            run.released.set()
            if run.stop is not None and not run.ended:  # the stop being carried out waits for it
                run.stop.terminal_arrived(params.type, params.model().event.payload)
                return None
        run.clock.activity()  # the runtime is not silent: its idle clock starts again
        if run.ended or run.stop is not None:
            run.late_events += 1
            self._stats.late_events += 1
            return None
        name, model, session_id, current = params.runtime_name, params.runtime_model, params.runtime_session_id, \
            run.runtime
        if (session_id or model) and (name, model, session_id) != (
                current.name, current.model, current.runtime_session_id):  # a new one only on change: hot path
            run.runtime = RuntimeInfo(name=name, model=model, runtime_session_id=session_id)
        run.telemetry.worker_event(params.type)
        return run

    async def _route(self, run: TaskRun, event: WireEvent, pending: PendingBatch) -> None:
        """Handle one accepted event. What goes wrong with it ends its own task only, never the batch."""
        try:
            await self._handle(run, event, pending)
        except CanonicalizationError as exc:  # hostile or buggy input
            await pending.flush()
            await self._ender.fail_and_stop(run, TaskFailureCode.PROTOCOL_ERROR,
                                            f"the runtime sent a {event.type} that cannot be stored: {exc}",
                                            retryable=False)
        except DatabaseError as exc:  # the disk failed: what was not stored was never acknowledged
            pending.drop(run)
            await pending.flush()
            await self._ender.lost_events(run, exc)
        except StoreError:
            raise
        except Exception as exc:  # never drop a batch (and a terminal event in it) silently
            log.exception("task %s: handling %s failed", run.task_id, event.type)
            await pending.flush()
            await self._ender.fail_and_stop(run, TaskFailureCode.INTERNAL,
                                            f"the supervisor could not handle the runtime's {event.type}: "
                                            f"{type(exc).__name__}: {exc}", retryable=False)

    async def _handle(self, run: TaskRun, event: WireEvent, pending: PendingBatch) -> None:
        if not run.input_stored.is_set():  # model.input comes first; it is being stored right now
            await pending.flush()
            await run.input_stored.wait()
            if run.ended:
                return
        runtime_session_id = run.runtime.runtime_session_id
        if run.switched_from is None and runtime_session_id and runtime_session_id != run.session.runtime_session_id:
            # The runtime named its own session: keep it, so the session's next task resumes it.
            run.session = await self._store.update_session(run.session_id, runtime_session_id=runtime_session_id)
        if event.type == EventType.TOOL_CALL_REQUESTED:
            request = event.model().event.payload
            assert isinstance(request, ToolCallRequested)
            await pending.flush()
            if self._budgets is not None and not await self._budgets.tool_call(run, request):
                return  # a limit is reached: the call never runs, the task is being stopped
            await self._tools.requested(run, request)
        elif event.type == EventType.MODEL_INPUT_APPENDED:
            appended = event.model().event.payload
            assert isinstance(appended, ModelInputAppended)
            stored = reported(run, appended)
            if stored is None:
                self._stats.invalid_events += 1
            else:
                pending.add(run, PendingEvent(event.type, stored))
        elif event.type == EventType.QUESTION_REQUESTED:
            question = event.model().event.payload
            assert isinstance(question, QuestionRequested)
            await pending.flush()
            await self._questions.asked(run, question)
        elif event.type in TERMINAL_EVENT_TYPES:
            await pending.flush()
            await self._ender.finish(run, event.type, await self._stderr_tail_as_blob(run, event.model().event.payload))
        else:
            plain = await self._plain(run, event, pending.blobs_for(run))
            if plain is not None:
                pending.add(run, plain)
            if event.type == EventType.USAGE_REPORTED and self._budgets is not None:
                report = event.model().event.payload
                assert isinstance(report, UsageReported)
                await pending.flush()  # stored before it is counted, and before a budget.reached it leads to
                await self._budgets.usage(run, report)

    async def _plain(self, run: TaskRun, event: WireEvent, blobs: Blobs) -> PendingEvent | None:
        """A plain event as it is to be stored (its raw message a blob, small ones into ``blobs``), or None
        (counted) for a runtime tool event the policy never approved. A delta and the like go on as the payload's
        JSON the decoder proved valid (no model); what the supervisor changes or reads is taken from the model."""
        if event.type not in _RUNTIME_TOOL_EVENTS and not event.has_raw:
            return PendingEvent(event.type, PayloadJson(event.type, event.payload_json))
        model = event.model().event
        payload = model.payload
        if event.type in _RUNTIME_TOOL_EVENTS:
            identity = run.approved_runtime_calls.get(getattr(payload, "tool_call_id", ""))
            if identity is None:  # the runtime ran a tool nobody approved: record, never store as fact
                self._stats.invalid_events += 1
                log.warning("task %s: %s for a call that was not approved; dropped", run.task_id, event.type)
                return None
            # a blob ref is the supervisor's to set (a worker has no store): one the worker named is dropped
            refs = {name: None for name in type(payload).model_fields if name.endswith("_ref")}
            payload = payload.model_copy(update={"attempt": identity.attempt, "input_hash": identity.input_hash,
                                                 **refs})
        if model.raw is None:
            return PendingEvent(event.type, payload)
        ref = await self._raw_blob(run, model.raw, blobs)
        return PendingEvent(event.type, payload, run.runtime.model_copy(update={"raw_ref": ref}))

    async def _raw_blob(self, run: TaskRun, raw: Any, inline: Blobs) -> str:
        """A runtime's raw message as a blob: small ones go into ``inline`` (committed with their event), big
        ones are written now. JSON that can't be canonicalized (a 64-bit int, say) is kept as plain JSON."""
        try:
            data = canonical_json(raw)
        except CanonicalizationError:
            data = json.dumps(raw, ensure_ascii=False, default=str).encode()
        ref = sha256_hex(data)
        if len(data) <= INLINE_BLOB_MAX:
            inline[ref] = (data, "application/json")
            return ref
        return await self._store.put_blob(data, "application/json", session_id=run.session_id)

    async def _stderr_tail_as_blob(self, run: TaskRun, payload: Model) -> Model:
        """A worker's ``task.failed`` may carry its runtime's stderr tail as text (``details.stderr_tail``): it
        is stored as a blob and the event keeps only ``details.stderr_tail_ref``, as for a crashed worker. A
        ``stderr_tail_ref`` the worker named itself is dropped: blob refs are the supervisor's to set."""
        if not isinstance(payload, TaskFailed) or not ({"stderr_tail", "stderr_tail_ref"} & payload.details.keys()):
            return payload
        details = dict(payload.details)
        details.pop("stderr_tail_ref", None)
        tail = details.pop("stderr_tail", None)
        if isinstance(tail, str) and tail:
            details["stderr_tail_ref"] = await self._store.put_blob(tail.encode("utf-8", "replace"),
                                                                    "text/plain; charset=utf-8",
                                                                    session_id=run.session_id)
        return payload.model_copy(update={"details": details})
