"""Every runtime behaves as its declared capabilities say: driven through the real supervisor and worker, each
declaration an app feature-detects by (parallel tool calls, resume, cancellation, interaction, usage, where tools
run and who decides them) is held against what the runtime does. A declaration a runtime does not live up to is
the adapter's bug (docs/protocol.md §3.1, "Capabilities"); one that contradicts itself is test_capabilities'."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from codesdk.protocol import (
    BUDGET_REACHED_REASON,
    BudgetGate,
    BudgetLimit,
    BudgetLimits,
    CancellationModel,
    EventType,
    ExecutedBy,
    InputDelivery,
    GrantScope,
    InteractionMode,
    NormalizedEvent,
    PermissionMode,
    PermissionModel,
    PolicySource,
    QuestionReply,
    ResumeMode,
    ResumeModel,
    RuntimeCapabilities,
    SteeringSupport,
    TaskStoppedEvent,
    ToolExecution,
    WorkerAnswer,
)
from codesdk.supervisor.engine import ApprovalRequest, ApproverAnswer, BudgetPaused, Engine, session_events
from codesdk.supervisor.store import TaskState
from codesdk.testing.invariants import check_session
from codesdk.worker.adapters.registry import default_registry
from codesdk.worker.command import TEST_STEPS_ENV

from tests.conftest import SCENARIOS, MakeEngine
from tests.contract.cases import Case, ScriptedCase, Turn, workspace
from tests.e2e.conftest import of_type, said, the_model_input
from tests.waits import until

#: A hang guard (seconds) around each test: a runtime that stops answering fails the test instead of hanging it.
#: Never a measure: nothing here asserts how long anything took.
HANG_GUARD_S = 240
#: The scripted runtime, asked to say what it was given of the earlier turns.
RECALL = {"scenario_inline": {"name": "recall", "steps": [{"text": "I recall: {{history}}"}]}}


async def _declared(engine: Engine, case: Case) -> RuntimeCapabilities:
    """What the worker offers for the case's runtime (its ``runtime.initialize``): what the supervisor, the API
    and the clients go by."""
    (offer,) = [o for o in await engine.runtimes("default") if o.name == case.runtime]
    assert offer.available, offer.unavailable_reason
    return offer.capabilities


async def _task_events(engine: Engine, session_id: str, task_id: str) -> list[NormalizedEvent]:
    """The task's events, once its session's hold every invariant."""
    events = await session_events(engine.store, session_id)
    check_session(events)
    return [e for e in events if e.trace.task_id == task_id]


def _outstanding_at_most(events: Iterable[NormalizedEvent]) -> int:
    """The most tool calls the runtime had waiting at once, by the stored order: a call is waiting from its
    ``tool.call.requested`` until its answer (``tool.call.completed`` or ``tool.call.denied``, each stored before
    the answer is sent to the runtime)."""
    waiting: set[tuple[str, int]] = set()
    most = 0
    for event in events:
        payload: Any = event.payload
        if event.type == EventType.TOOL_CALL_REQUESTED:
            waiting.add((payload.tool_call_id, payload.attempt))
            most = max(most, len(waiting))
        elif event.type in (EventType.TOOL_CALL_COMPLETED, EventType.TOOL_CALL_DENIED):
            waiting.discard((payload.tool_call_id, payload.attempt))
    return most


async def test_the_offer_is_the_adapters_declaration(make_engine: MakeEngine, case: Case,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """What a worker offers at ``runtime.initialize`` (and so GET /v1/runtimes and the clients) is the adapter's
    own ``capabilities()``, built in the worker's environment: one source, nothing added or lost on the way."""
    for name, value in {**case.worker_env(), "CODESDK_SCENARIO_DIR": SCENARIOS, TEST_STEPS_ENV: "1"}.items():
        monkeypatch.setenv(name, value)
    adapter = default_registry().get(case.runtime)
    assert adapter is not None
    with trio.fail_after(HANG_GUARD_S):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            offered = await _declared(engine, case)
    assert offered == adapter.capabilities()


async def test_parallel_tool_calls_as_declared(make_engine: MakeEngine, case: Case, tmp_path: Path) -> None:
    """``parallel_tool_calls``: a turn that asks for two calls has both waiting before either is answered (the
    approver holds the first until the second is asked for), and never more than ``max_outstanding_tool_calls``.
    Not declared: never two waiting at once (each answered before the next is asked for)."""
    ws = workspace(tmp_path)
    turn = case.tools(("workspace.write", {"path": "one.txt", "content": "1\\n"}),
                      ("workspace.write", {"path": "two.txt", "content": "2\\n"}))
    asked: list[str] = []
    both_asked = trio.Event()

    async def approve_once_both_asked(request: ApprovalRequest) -> ApproverAnswer:
        asked.append(request.identity.tool_call_id if request.identity else "?")
        if len(asked) == 2:
            both_asked.set()
        if parallel:
            # A runtime that runs its calls one at a time never asks for the second: the hang guard ends the
            # wait, and the order of the stored events below says what happened.
            with trio.move_on_after(HANG_GUARD_S / 3):
                await both_asked.wait()
        return ApproverAnswer(allow=True, reason="both asked")

    with trio.fail_after(HANG_GUARD_S):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            declared = await _declared(engine, case)
            parallel = declared.parallel_tool_calls
            session = await engine.create_session(runtime=case.runtime, workspace=ws)
            task = await engine.start_task(session.session_id, turn.prompt, runtime_config=turn.runtime_config,
                                           permission_mode=PermissionMode.ASK,
                                           interaction_mode=InteractionMode.INTERACTIVE,
                                           approver=approve_once_both_asked)
            record = await engine.wait_task(task.task_id)
            events = await _task_events(engine, session.session_id, task.task_id)
    assert record.state == TaskState.COMPLETED, record.error
    assert len(of_type(events, EventType.TOOL_CALL_REQUESTED)) == 2
    assert (ws / "one.txt").read_text() == "1\\n" and (ws / "two.txt").read_text() == "2\\n"
    most = _outstanding_at_most(events)
    if parallel:
        assert most == 2, f"{case.runtime} declares parallel_tool_calls but had at most {most} call waiting"
        if declared.max_outstanding_tool_calls is not None:
            assert most <= declared.max_outstanding_tool_calls
    else:
        assert most == 1, f"{case.runtime} declares no parallel tool calls but had {most} waiting at once"


async def test_resume_as_declared(make_engine: MakeEngine, case: Case, tmp_path: Path) -> None:
    """``resume_model``: ``native`` — the session's second task takes up the runtime's own session (model.input
    says so, the runtime session is the same one, and the model is sent the first turn from the runtime's own
    store, not CodeSDK's rebuilt transcript); ``reconstruct`` — the second task is given the rebuilt transcript."""
    turns = [case.stream("remember marker-5501"),
             Turn("what came before?", RECALL) if isinstance(case, ScriptedCase) else case.stream("and marker-5502")]
    fake = getattr(case, "fake", None)  # the fake model API of a real runtime (None: the scripted runtime)
    with trio.fail_after(HANG_GUARD_S):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            declared = await _declared(engine, case)
            session = await engine.create_session(runtime=case.runtime, workspace=workspace(tmp_path))
            runtime_sessions, seen = [], []
            for turn in turns:
                before = len(fake.requests()) if fake is not None else 0
                task = await engine.start_task(session.session_id, turn.prompt, runtime_config=turn.runtime_config)
                assert (record := await engine.wait_task(task.task_id)).state == TaskState.COMPLETED, record.error
                runtime_sessions.append((await engine.store.get_session(session.session_id)).runtime_session_id)
                events = await _task_events(engine, session.session_id, task.task_id)
                seen.append(json.dumps([r["body"] for r in fake.requests()[before:]]) if fake is not None
                            else said(events))
            given = the_model_input(events)
    if declared.resume_model == ResumeModel.NONE:
        pytest.skip(f"{case.runtime} declares resume_model none: nothing to hold")
    assert "marker-5501" in seen[1], f"{case.runtime}: the second task was not given the first turn"
    if declared.resume_model == ResumeModel.NATIVE:
        assert given.resume == ResumeMode.NATIVE, f"{case.runtime} declares native resume but was {given.resume}"
        assert runtime_sessions[0] is not None and runtime_sessions[1] == runtime_sessions[0]
        assert "conversation_record" not in seen[1]  # the runtime's own history, not CodeSDK's transcript
    else:
        assert given.resume == ResumeMode.RECONSTRUCTED, \
            f"{case.runtime} declares reconstruct but was {given.resume}"
        if fake is not None:
            assert "conversation_record" in seen[1]


async def test_stop_and_cancellation_as_declared(make_engine: MakeEngine, case: Case, tmp_path: Path) -> None:
    """``stop``: the worker accepts ``runtime.stop`` for a running task. ``cancellation_model``: ``guaranteed`` —
    the task ends stopped and no process of it is left among the worker's children; ``best_effort`` — the task
    ends (stopped, or completed if the runtime finished first). Either way the worker serves the next task."""
    ready = tmp_path / "runtime-ready"
    turn = case.with_runtime_process(ready)
    with trio.fail_after(HANG_GUARD_S):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            declared = await _declared(engine, case)
            if not declared.stop:
                pytest.skip(f"{case.runtime} declares stop: false: no stop to hold it to")
            session = await engine.create_session(runtime=case.runtime, workspace=workspace(tmp_path))
            task = await engine.start_task(session.session_id, turn.prompt, runtime_config=turn.runtime_config,
                                           permission_mode=PermissionMode.YOLO)
            worker = engine.pool.worker_of("default")
            assert worker is not None
            found: list[psutil.Process] = []

            def runtime_started() -> bool:
                found[:] = _runtime_processes(worker.pid, case)
                return bool(found)

            await until("the runtime's process", runtime_started)
            await until("the runtime at work", lambda: case.runtime_ready(ready))
            record = await engine.stop_task(task.task_id, reason="capability check")
            events = await _task_events(engine, session.session_id, task.task_id)
            left = list(_runtime_processes(worker.pid, case))
            again = case.stream("after the stop")
            nxt = await engine.start_task(session.session_id, again.prompt, runtime_config=again.runtime_config)
            assert (await engine.wait_task(nxt.task_id)).state == TaskState.COMPLETED, "the worker serves no more"
            assert engine.pool.worker_of("default") is worker
    stopped = [e for e in events if isinstance(e, TaskStoppedEvent)]
    if stopped:
        receipt = stopped[0].payload.receipt
        assert receipt is not None and receipt.worker == WorkerAnswer.CONFIRMED and receipt.interrupt_sent
    if declared.cancellation_model == CancellationModel.GUARANTEED:
        assert record.state == TaskState.STOPPED, f"{case.runtime} declares guaranteed cancellation: {record.state}"
        assert not left, f"{case.runtime} declares guaranteed cancellation, yet after the stop: {left}"
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in found)
    else:
        assert record.state in (TaskState.STOPPED, TaskState.COMPLETED), record.state


def _runtime_processes(worker_pid: int, case: Case) -> Iterator[psutil.Process]:
    """The worker's descendants that are the case's runtime (those still there)."""
    for process in psutil.Process(worker_pid).children(recursive=True):
        try:
            if process.status() != psutil.STATUS_ZOMBIE and case.is_runtime_process(process):
                yield process
        except psutil.NoSuchProcess:
            continue


async def test_interactive_asks_a_person_as_declared(make_engine: MakeEngine, case: Case, tmp_path: Path) -> None:
    """``interactive`` among ``interaction_modes``: a task run so puts a call that needs approval to the task's
    approver, and runs it once the person allows it."""
    ws = workspace(tmp_path)
    turn = case.tools(("workspace.write", {"path": "allowed.txt", "content": "yes\n"}))
    asked: list[str] = []

    async def person(request: ApprovalRequest) -> ApproverAnswer:
        asked.append(request.tool_name)
        return ApproverAnswer(allow=True, reason="a person said yes")

    with trio.fail_after(HANG_GUARD_S):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            declared = await _declared(engine, case)
            if InteractionMode.INTERACTIVE not in declared.interaction_modes:
                pytest.skip(f"{case.runtime} does not declare interactive among its interaction modes")
            session = await engine.create_session(runtime=case.runtime, workspace=ws)
            task = await engine.start_task(session.session_id, turn.prompt, runtime_config=turn.runtime_config,
                                           permission_mode=PermissionMode.ASK,
                                           interaction_mode=InteractionMode.INTERACTIVE, approver=person)
            assert (record := await engine.wait_task(task.task_id)).state == TaskState.COMPLETED, record.error
            events = await _task_events(engine, session.session_id, task.task_id)
    assert asked == ["workspace.write"] and (ws / "allowed.txt").read_text() == "yes\n"
    assert [a.source for a in of_type(events, EventType.TOOL_CALL_APPROVED)] == [PolicySource.USER]


async def test_a_session_grant_answers_the_next_matching_call_unasked(make_engine: MakeEngine, case: Case,
                                                                     tmp_path: Path) -> None:
    """Scoped grants (every runtime, whatever its ``approval_scopes``: the supervisor enforces every scope for the
    calls it decides): a person allows a write for the session; the session's next task's write is decided by that
    grant — no ``approval.requested``, the person not asked, a ``user`` evaluation ``grant.session`` naming it —
    and runs. Once revoked, the grant decides nothing: the write after is asked again."""
    ws = workspace(tmp_path)
    asked: list[str] = []

    async def person(request: ApprovalRequest) -> ApproverAnswer:
        asked.append(str(request.input.get("path")))
        return ApproverAnswer(allow=True, reason="for the session", scope=GrantScope.SESSION)

    async def write(engine: Engine, session_id: str, path: str) -> list[NormalizedEvent]:
        turn = case.tools(("workspace.write", {"path": path, "content": f"{path}\n"}))
        task = await engine.start_task(session_id, turn.prompt, runtime_config=turn.runtime_config,
                                       permission_mode=PermissionMode.ASK,
                                       interaction_mode=InteractionMode.INTERACTIVE, approver=person)
        assert (record := await engine.wait_task(task.task_id)).state == TaskState.COMPLETED, record.error
        return await _task_events(engine, session_id, task.task_id)

    with trio.fail_after(HANG_GUARD_S):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            declared = await _declared(engine, case)
            if InteractionMode.INTERACTIVE not in declared.interaction_modes:
                pytest.skip(f"{case.runtime} does not declare interactive among its interaction modes")
            assert GrantScope.ONCE in declared.approval_scopes
            session = await engine.create_session(runtime=case.runtime, workspace=ws)
            first = await write(engine, session.session_id, "one.txt")
            second = await write(engine, session.session_id, "two.txt")
            [grant] = of_type(first, EventType.GRANT_CREATED)
            await engine.grants.revoke(session, grant.grant_id, "contract")
            third = await write(engine, session.session_id, "three.txt")
            check_session(await session_events(engine.store, session.session_id))
    assert asked == ["one.txt", "three.txt"]
    assert grant.scope == GrantScope.SESSION and grant.tool_name == "workspace.write"
    assert len(of_type(first, EventType.APPROVAL_REQUESTED)) == 1
    assert not of_type(second, EventType.APPROVAL_REQUESTED)
    by_grant = [p for p in of_type(second, EventType.TOOL_CALL_POLICY_EVALUATED) if p.source == PolicySource.USER]
    assert [(p.rule, p.grant_id) for p in by_grant] == [("grant.session", grant.grant_id)]
    assert len(of_type(third, EventType.APPROVAL_REQUESTED)) == 1
    assert all((ws / name).read_text() == f"{name}\n" for name in ("one.txt", "two.txt", "three.txt"))


async def test_tools_run_and_are_decided_where_declared(make_engine: MakeEngine, case: Case,
                                                        tmp_path: Path) -> None:
    """One non-interactive turn in ``ask`` mode asking for a read and a write, held to four declarations.
    ``non_interactive``: the task never waits for a person — the write is denied with the reason said, no approval
    asked for, and the runtime carries on with the read's result and the denial's reason. ``tool_execution``
    ``external_mcp`` or ``hybrid``: CodeSDK's tools reach it as tool.call.requested and run in the supervisor.
    ``permission_model`` ``codesdk``: every call is decided by CodeSDK's policy (a policy_evaluated by codesdk, the
    decision by codesdk), a denied one never runs. ``usage_reporting``: the turn reports its usage
    (usage.reported); not declared, it reports none. (The test waits for the end under a hang guard only: a task
    that waited for a person would hang it.)"""
    ws = workspace(tmp_path)
    turn = case.tools(("workspace.read", {"path": "a.txt"}), ("workspace.write", {"path": "b.txt", "content": "x"}))
    with trio.fail_after(HANG_GUARD_S):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            declared = await _declared(engine, case)
            if not declared.non_interactive:
                pytest.skip(f"{case.runtime} does not declare non_interactive among its interaction modes")
            session = await engine.create_session(runtime=case.runtime, workspace=ws)
            task = await engine.start_task(session.session_id, turn.prompt, runtime_config=turn.runtime_config,
                                           permission_mode=PermissionMode.ASK,
                                           interaction_mode=InteractionMode.NON_INTERACTIVE)
            assert (record := await engine.wait_task(task.task_id)).state == TaskState.COMPLETED, record.error
            events = await _task_events(engine, session.session_id, task.task_id)
    assert not of_type(events, EventType.APPROVAL_REQUESTED)
    denied = of_type(events, EventType.TOOL_CALL_DENIED)
    assert len(denied) == 1 and "non-interactive" in denied[0].reason
    final = [p.text for p in of_type(events, EventType.MODEL_OUTPUT_COMPLETED) if p.kind == "text"][-1]
    assert "alpha" in final  # the read result reached the runtime
    assert "non-interactive" in final  # and so did the denial's reason; the runtime carried on
    reported = bool(of_type(events, EventType.USAGE_REPORTED))
    assert reported == declared.usage_reporting, f"{case.runtime} declares usage_reporting " \
        f"{declared.usage_reporting} but reported {'some' if reported else 'none'}"
    if declared.tool_execution == ToolExecution.RUNTIME_INTERNAL:
        pytest.skip(f"{case.runtime} runs its tools itself: CodeSDK's do not reach it")
    requested = of_type(events, EventType.TOOL_CALL_REQUESTED)
    assert sorted((r.tool_name, r.executed_by) for r in requested) == [
        ("workspace.read", ExecutedBy.SUPERVISOR), ("workspace.write", ExecutedBy.SUPERVISOR)]
    started = of_type(events, EventType.TOOL_CALL_STARTED)
    assert [(s.tool_name, s.executed_by) for s in started] == [("workspace.read", ExecutedBy.SUPERVISOR)]
    assert (ws / "a.txt").exists() and not (ws / "b.txt").exists()
    if declared.permission_model != PermissionModel.CODESDK:
        pytest.skip(f"{case.runtime} declares permission_model {declared.permission_model}: not only CodeSDK's")
    for call in requested:
        evaluated = [p for p in of_type(events, EventType.TOOL_CALL_POLICY_EVALUATED)
                     if p.tool_call_id == call.tool_call_id]
        assert evaluated and {p.source for p in evaluated} == {PolicySource.CODESDK}, evaluated
    decisions = of_type(events, EventType.TOOL_CALL_APPROVED) + of_type(events, EventType.TOOL_CALL_DENIED)
    assert len(decisions) == 2 and {d.source for d in decisions} == {PolicySource.CODESDK}


async def test_steering_as_declared(make_engine: MakeEngine, case: Case, tmp_path: Path) -> None:
    """``steering``: an input sent while the runtime's turn runs (here: while a call of it waits for a person).
    ``mid_turn`` — it is taken into that turn: answered and recorded ``mid_turn``, and the next request to the model
    carries its text; ``next_turn`` — answered ``queued``, recorded ``queued`` with the task's end, and the session's
    next task carries it (``model.input.carried_inputs``) to the model."""
    ws = workspace(tmp_path)
    turn = case.tools(("workspace.write", {"path": "steered.txt", "content": "x\n"}))
    marker = "steer-marker-7301"
    asked, sent = trio.Event(), trio.Event()

    async def person(request: ApprovalRequest) -> ApproverAnswer:
        asked.set()
        await sent.wait()  # the input goes in while the turn waits on this call
        return ApproverAnswer(allow=True, reason="a person said yes")

    fake = getattr(case, "fake", None)  # the fake model API of a real runtime (None: the scripted runtime)
    with trio.fail_after(HANG_GUARD_S):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            declared = await _declared(engine, case)
            if InteractionMode.INTERACTIVE not in declared.interaction_modes:
                pytest.skip(f"{case.runtime} does not declare interactive: no turn to hold open here")
            session = await engine.create_session(runtime=case.runtime, workspace=ws)
            task = await engine.start_task(session.session_id, turn.prompt, runtime_config=turn.runtime_config,
                                           permission_mode=PermissionMode.ASK,
                                           interaction_mode=InteractionMode.INTERACTIVE, approver=person)
            await asked.wait()
            before = len(fake.requests()) if fake is not None else 0
            answer = await engine.send_input(task.task_id, f"also note {marker}", input_id="steer-1")
            sent.set()
            assert (record := await engine.wait_task(task.task_id)).state == TaskState.COMPLETED, record.error
            events = await _task_events(engine, session.session_id, task.task_id)
            later = json.dumps([r["body"] for r in fake.requests()[before:]]) if fake is not None else ""
            if declared.steering == SteeringSupport.NEXT_TURN:
                again = case.stream("carry on")
                before = len(fake.requests()) if fake is not None else 0
                nxt = await engine.start_task(session.session_id, again.prompt, runtime_config=again.runtime_config)
                assert (record := await engine.wait_task(nxt.task_id)).state == TaskState.COMPLETED, record.error
                next_events = await _task_events(engine, session.session_id, nxt.task_id)
                later = json.dumps([r["body"] for r in fake.requests()[before:]]) if fake is not None \
                    else said(next_events)
    [appended] = of_type(events, EventType.MODEL_INPUT_APPENDED)
    assert (appended.input_id, appended.text) == ("steer-1", f"also note {marker}")
    if declared.steering == SteeringSupport.MID_TURN:
        assert (answer.delivery, appended.delivery) == (InputDelivery.MID_TURN, InputDelivery.MID_TURN), \
            f"{case.runtime} declares mid_turn steering: {answer.delivery}, recorded {appended.delivery}"
        requests = [p.request_id for p in of_type(events, EventType.RUNTIME_REQUEST_STARTED)]
        assert appended.before_request_id in requests[1:], "it went into a request after the turn's first"
        if fake is not None:
            assert marker in later, f"{case.runtime}: no request to the model after the input carried it"
    else:
        assert (answer.delivery, appended.delivery) == (InputDelivery.QUEUED, InputDelivery.QUEUED)
        assert the_model_input(next_events).carried_inputs == ("steer-1",)
        assert marker in later, f"{case.runtime}: the next task's model was not given the queued input"
async def test_user_questions_as_declared(make_engine: MakeEngine, case: Case, tmp_path: Path) -> None:
    """``user_questions``: the runtime's question arrives as ``question.requested`` of a source it declares, is
    answered over the API (the broker ``POST /v1/questions/{id}`` answers through), and the runtime receives the
    answer: its next model request carries it, so what it says next quotes it. Declared none: the runtime has no
    question that can reach its user (the pinned ACP agents), and the case has none to make it ask."""
    turn = case.question()
    with trio.fail_after(HANG_GUARD_S):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            declared = await _declared(engine, case)
            if not declared.user_questions:
                assert turn is None, f"{case.runtime} declares no user_questions, but its case can make it ask"
                return
            assert turn is not None, f"{case.runtime} declares {declared.user_questions}: its case must ask one"
            session = await engine.create_session(runtime=case.runtime, workspace=workspace(tmp_path))
            task = await engine.start_task(session.session_id, turn.prompt, runtime_config=turn.runtime_config,
                                           permission_mode=PermissionMode.ASK, durable_approvals=True)
            while not (pending := await engine.store.list_questions(task_id=task.task_id)):
                if engine.active_task(session.session_id) is None:  # it ended without asking
                    events = await _task_events(engine, session.session_id, task.task_id)
                    pytest.fail(f"{case.runtime} never asked its question; it said: {said(events)!r}")
                await trio.sleep(0.05)
            [asked] = pending
            assert asked.request.source in declared.user_questions
            [question] = asked.request.questions
            assert [o.label for o in question.options] == ["red", "blue"] and "Which colour" in question.text
            await engine.questions.answer(asked.question_id, QuestionReply(answers={question.id: "blue"}),
                                          "api:contract")
            record = await engine.wait_task(task.task_id)
            events = await _task_events(engine, session.session_id, task.task_id)
    assert record.state == TaskState.COMPLETED, record.error
    [answered] = of_type(events, EventType.QUESTION_ANSWERED)
    assert answered.answers == {question.id: "blue"} and answered.answered_via == "user"
    assert "blue" in said(events).split("ANSWER:" if case.runtime == "scripted" else "RESULTS:", 1)[-1], said(events)
async def test_a_budget_pauses_the_session_and_a_raise_goes_on_as_declared(make_engine: MakeEngine, case: Case,
                                                                            tmp_path: Path) -> None:
    """``budget_gate``: a task with a tool-call budget of 0 ends ``budget.reached`` (found before its first call was
    decided: the runtime's next request waited on it) then ``task.stopped`` reason ``budget_reached`` with its
    receipt, the call never run, and its session paused; a raise with ``continue`` runs a new task of the session to
    completion. A token budget of 1 is found reached at the first usage report (``after_usage``), and pauses the
    session the same way (a runtime that reports no tokens never reaches one)."""
    ws = workspace(tmp_path)
    turn = case.tools(("workspace.read", {"path": "a.txt"}))
    with trio.fail_after(HANG_GUARD_S):
        async with make_engine(worker_env={"*": case.worker_env()}) as engine:
            declared = await _declared(engine, case)
            session = await engine.create_session(runtime=case.runtime, workspace=ws)
            sid = session.session_id
            task = await engine.start_task(sid, turn.prompt, runtime_config=turn.runtime_config,
                                           permission_mode=PermissionMode.YOLO, budget=BudgetLimits(tool_calls=0))
            record = await engine.wait_task(task.task_id)
            events = await _task_events(engine, sid, task.task_id)
            paused = (await engine.store.get_session(sid)).budget
            with pytest.raises(BudgetPaused):
                await engine.start_task(sid, "more")
            _, going_on = await engine.raise_budget(sid, BudgetLimits(), by="contract", go_on=True)
            assert going_on is not None
            went_on = await engine.wait_task(going_on.task_id)
            check_session(await session_events(engine.store, sid))

            priced = await engine.create_session(runtime=case.runtime, workspace=ws,
                                                 budget=BudgetLimits(tokens=1))
            chat = case.stream("count the tokens")
            over = await engine.start_task(priced.session_id, chat.prompt, runtime_config=chat.runtime_config)
            over_record = await engine.wait_task(over.task_id)
            over_events = await _task_events(engine, priced.session_id, over.task_id)
            over_paused = (await engine.store.get_session(priced.session_id)).budget
    assert declared.budget_gate in tuple(BudgetGate)
    assert record.state == TaskState.STOPPED, record.error
    (reached,) = of_type(events, EventType.BUDGET_REACHED)
    assert (reached.limit, reached.gate, reached.spent.tool_calls) == (BudgetLimit.TOOL_CALLS,
                                                                      BudgetGate.BEFORE_REQUEST, 0)
    assert not of_type(events, EventType.TOOL_CALL_STARTED), "a call past the budget ran"
    stopped = [e for e in events if isinstance(e, TaskStoppedEvent)]
    assert stopped[-1].payload.reason == BUDGET_REACHED_REASON and stopped[-1].payload.receipt is not None
    assert paused is not None and paused.paused == reached
    assert went_on.state == TaskState.COMPLETED, went_on.error
    counted = sum(u.input_tokens + u.output_tokens for u in of_type(over_events, EventType.USAGE_REPORTED))
    if not counted:  # it reports no tokens (codex-acp's answers carry none): a token budget is never reached
        assert over_record.state == TaskState.COMPLETED and not of_type(over_events, EventType.BUDGET_REACHED)
        return
    assert over_record.state == TaskState.STOPPED, over_record.error
    (tokens,) = of_type(over_events, EventType.BUDGET_REACHED)
    assert tokens.limit == BudgetLimit.TOKENS and tokens.gate == BudgetGate.AFTER_USAGE and tokens.spent.tokens >= 1
    assert over_paused is not None and over_paused.paused == tokens and over_paused.spent.tokens == tokens.spent.tokens
