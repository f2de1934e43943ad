"""Which namespaces this supervisor runs (``store.Leases``), and what follows from a lease changing hands.

- Before a namespace's session is created or its task started or stopped here, its lease must be ours
  (``own``); a namespace another live supervisor holds is refused with where to go (``NamespaceElsewhere``).
- A lease taken over (from nobody, or from a supervisor that is gone) makes the tasks left running in the
  namespace orphans: each is failed once with ``SUPERVISOR_RESTARTED`` (the calls it left running ended with it,
  ``cut_short: interrupted``), and its pending approvals are closed — or with ``TASK_TIMEOUT`` if its stored
  wall-clock deadline (``task.started``'s ``timeout_s`` from that event's time) had passed by then: nothing of a
  task survives its supervisor, so a deadline is never re-armed, but a task that had run out of time is told so.
  At start-up every namespace with such tasks is taken over where no live supervisor holds it (``recover``).
- While the service runs (``keep``): leases are renewed; the namespaces of supervisors that died are taken over
  where they left tasks running; a lease lost (we were cut off from the database for too long, and another may
  have taken the namespace) ends our part at once: our runs there are dropped without storing anything, and the
  namespace's worker is let go.
- A write of ours the database refused because the namespace's lease moved on (``store.Fenced``: we were paused or
  cut off while another supervisor took it over) is a lease lost the same way, found out sooner (``fenced``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import trio

from codesdk.protocol import (
    BUDGET_REACHED_REASON,
    ApprovalState,
    CallCutShort,
    EventType,
    Model,
    RuntimeInfo,
    StopReceipt,
    TaskFailed,
    TaskFailureCode,
    TaskStarted,
    TaskStopped,
    Trace,
    WorkerAnswer,
)

from ..store import (
    EventDraft,
    Fenced,
    InvalidTransition,
    Leases,
    Recorder,
    StoreError,
    TaskRecord,
    TaskState,
    TaskUpdate,
)
from ._approvals import ApprovalBroker
from ._questions import QuestionBroker, question_ends
from ._errors import NamespaceElsewhere
from ._runs import RunTable
from ._stopping import cut_short_ends, open_calls

log = logging.getLogger("codesdk.supervisor.engine")

#: Lets go of a namespace's worker (its lease is lost: someone else may run the namespace now).
LetGo = Callable[[str], Awaitable[None]]


class Leasing:
    def __init__(self, store: Recorder, leases: Leases, runs: RunTable, approvals: ApprovalBroker,
                 let_go: LetGo, *, wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 questions: QuestionBroker | None = None) -> None:
        self.store = store
        self._questions = questions
        self._wall_clock = wall_clock
        self.leases = leases
        self._runs = runs
        self._approvals = approvals
        self._let_go = let_go
        #: one claim at a time per namespace: a request that finds the namespace being taken over waits until the
        #: orphans there are failed, so that a task it starts meanwhile is never taken for one
        self._claiming: dict[str, trio.Lock] = {}
        #: Told when a namespace moved here (taken over with tasks left running, now failed): the service's webhooks.
        self.on_moved: Callable[[str, int], None] | None = None
        #: namespaces whose lease a refused write showed to be lost, for ``keep`` to let go of
        self._refused_send, self._refused = trio.open_memory_channel[str](float("inf"))

    def fenced(self, refused: Fenced) -> None:
        """The store refused a write of ours for a namespace (its lease moved on): let the namespace go as a lost
        lease (once per holding: later refusals of the same epoch find it let go already)."""
        if self.leases.let_go(refused.namespace, refused.epoch):
            log.error("namespace %s: a write was refused, its lease having passed to another supervisor (this one "
                      "was paused or cut off); the namespace is let go here", refused.namespace)
            self._refused_send.send_nowait(refused.namespace)

    async def own(self, namespace: str) -> None:
        """Make the namespace's lease ours, or refuse (``NamespaceElsewhere``, nothing done)."""
        lock = self._claiming.setdefault(namespace, trio.Lock())
        try:
            async with lock:
                claim = await self.leases.claim(namespace)
                if claim.holder is not None:
                    raise NamespaceElsewhere(namespace, claim.holder)
                if claim.taken_over:
                    failed = await self._fail_orphans(namespace)
                    if failed and self.on_moved is not None:
                        self.on_moved(namespace, failed)
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting:  # kept only while someone needs it
                self._claiming.pop(namespace, None)

    async def recover(self) -> None:
        """At start-up: take over the namespaces where tasks were left running and no live supervisor holds the
        lease, failing those tasks. Approvals can only be pending for running tasks, so theirs are closed too."""
        for namespace in await self._namespaces_with_orphans():
            try:
                await self.own(namespace)
            except NamespaceElsewhere:
                continue  # another supervisor runs those tasks

    async def keep(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Renew our leases for as long as the engine runs, and let go of them at their deadline if renewals do not
        get through — failing or hanging (nothing to do where they cannot be lost)."""
        every = self.leases.renew_every_s
        async with trio.open_nursery() as nursery:
            task_status.started()
            if every is None:
                return
            nursery.start_soon(self._fence, every)
            nursery.start_soon(self._let_go_refused)
            await self._renew_forever(every)

    async def _renew_forever(self, every: float) -> None:
        failing = False
        while True:
            with trio.move_on_after(every):
                await self.leases.renewal_wanted.wait()
            self.leases.renewal_wanted = trio.Event()
            try:
                renewal = await self.leases.renew()
                for namespace in sorted(renewal.lost):
                    await self._lost(namespace)
                expired = await self.leases.expired()
                if expired:
                    await self._take_over(expired)
                if failing:
                    log.warning("namespace leases are renewed again")
                failing = False
            except StoreError as exc:
                if not failing:  # once per outage, not at every attempt
                    log.error("namespace leases could not be renewed (retrying every %.1f s): %s", every, exc)
                failing = True

    async def _fence(self, every: float) -> None:
        """At the leases' deadline, however the renewal in flight is doing (a connection that hangs never fails):
        let go of every namespace before another supervisor may take it."""
        while True:
            deadline = self.leases.deadline
            assert deadline is not None
            if trio.current_time() < deadline:
                await trio.sleep_until(deadline)
                continue
            for namespace in sorted(self.leases.forfeit()):
                await self._lost(namespace)
            await trio.sleep(every)

    async def _let_go_refused(self) -> None:
        async for namespace in self._refused:
            if namespace not in (self.leases.epochs or {}):  # not claimed again meanwhile
                await self._lost(namespace)

    async def _take_over(self, expired: list[str]) -> None:
        """Namespaces whose supervisor is gone: where it left tasks running, take them over (and fail those); the
        other leases are dropped, so nobody looks at them again — a request takes the namespace when one comes."""
        orphaned = set(await self._namespaces_with_orphans())
        for namespace in expired:
            if namespace not in orphaned:
                continue
            try:
                await self.own(namespace)
                log.warning("namespace %s: its supervisor is gone; taken over here", namespace)
            except NamespaceElsewhere:
                pass  # another supervisor was quicker
        await self.leases.drop_expired([n for n in expired if n not in orphaned])

    async def _namespaces_with_orphans(self) -> list[str]:
        """Namespaces with tasks active in the store that this supervisor does not run, or approvals pending for
        such tasks."""
        namespaces: set[str] = set()
        orphaned_sessions = {record.session_id for record in await self.store.list_active_tasks()
                             if self._runs.active(record.task_id) is None}
        for session_id in sorted(orphaned_sessions):
            namespaces.add((await self.store.get_session(session_id)).namespace)
        for approval in await self.store.list_approvals(state=ApprovalState.PENDING):
            if self._runs.active(approval.task_id) is None:
                namespaces.add(approval.namespace)
        return sorted(namespaces)

    async def _fail_orphans(self, namespace: str) -> int:
        """End the tasks a supervisor that is gone left running in the namespace; how many were."""
        failed = 0
        for record in await self.store.list_active_tasks(namespace):
            if self._runs.active(record.task_id) is not None:
                continue
            session = await self.store.get_session(record.session_id)
            end: Model = await self._orphan_failure(record)
            end_type, state = EventType.TASK_FAILED, TaskState.FAILED
            paused = session.budget.paused if session.budget is not None else None
            if paused is not None and paused.task_id == record.task_id:  # it was being stopped at its budget
                end_type, state = EventType.TASK_STOPPED, TaskState.STOPPED
                end = TaskStopped(reason=BUDGET_REACHED_REASON, requested_by="supervisor", receipt=StopReceipt(
                    worker=WorkerAnswer.EXITED, worker_detail="the supervisor stopping the task at its budget "
                    "stopped meanwhile; its worker, and every process of the task, went with it"))
            runtime, trace = RuntimeInfo(name=session.runtime), Trace(session_id=record.session_id,
                                                                      task_id=record.task_id)
            ends = cut_short_ends(await open_calls(self.store, record.session_id, record.task_id),
                                  CallCutShort.INTERRUPTED)  # an approved call is started → completed, once
            asked = await question_ends(self.store, record.session_id, record.task_id, runtime, trace,
                                        "the supervisor running the task stopped before an answer")
            try:
                await self.store.append(record.session_id, [
                    *(EventDraft(type=EventType.TOOL_CALL_COMPLETED, runtime=runtime, payload=end, trace=trace)
                      for end in ends),
                    *asked,
                    EventDraft(type=end_type, runtime=runtime, payload=end, trace=trace)],
                    task_update=TaskUpdate(task_id=record.task_id, state=state,
                                           error=end.to_json_obj() if state == TaskState.FAILED else None))
            except InvalidTransition:
                continue  # it ended meanwhile: its one terminal event is stored already
            log.warning("task %s was left %s by a supervisor that is gone; marked %s", record.task_id,
                        record.state, state.value)
            failed += 1
        await self._approvals.expire_orphans(namespace)
        if self._questions is not None:
            await self._questions.expire_orphans(namespace)
        return failed

    async def _orphan_failure(self, record: TaskRecord) -> TaskFailed:
        """How a task left running by a supervisor that is gone fails: ``TASK_TIMEOUT`` if its stored wall-clock
        deadline has passed, else ``SUPERVISOR_RESTARTED``."""
        gone = TaskFailed(code=TaskFailureCode.SUPERVISOR_RESTARTED, retryable=True,
                          message="the supervisor running this task stopped (or lost the namespace); its "
                                  "worker went with it")
        started = await self.store.read_types(record.session_id, [EventType.TASK_STARTED], 0, 1,
                                              task_id=record.task_id)
        if not started or not isinstance(started[0].payload, TaskStarted) or started[0].payload.timeout_s is None:
            return gone
        timeout_s = started[0].payload.timeout_s
        ran_s = (self._wall_clock() - started[0].time).total_seconds()
        if ran_s < timeout_s:
            return gone
        return TaskFailed(code=TaskFailureCode.TASK_TIMEOUT, retryable=False, details={
            "deadline": "timeout_s", "limit_s": timeout_s, "ran_s": round(ran_s, 3)},
            message=f"the task passed its deadline: timeout_s = {timeout_s:g} s since it started; the supervisor "
                    f"running it stopped meanwhile (its worker went with it), so no stop receipt was taken")

    async def _lost(self, namespace: str) -> None:
        """The lease is no longer ours: drop our runs there (their end is the new holder's to record) and let the
        namespace's worker go."""
        for run in self._runs.active_runs():
            if run.namespace == namespace:
                run.ended = True  # nothing more of it is stored by us
                self._runs.end(run)
                run.done.set()
                log.error("task %s: the lease of namespace %s was lost; the task is left to the supervisor that "
                          "takes the namespace over", run.task_id, namespace)
        await self._let_go(namespace)
