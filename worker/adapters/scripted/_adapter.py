"""The scripted runtime: plays a scenario file as if a model were answering.

It needs no credentials and no network, so it is the embedded default and the reference every real
adapter follows: stream deltas with stable block ids, request tool calls and wait for the supervisor's
answers, branch on denial, report usage, complete. Fault steps (crash, hang, flood, bad lines) exist so
the supervisor's failure handling can be tested against a real process.
"""

from __future__ import annotations

import json
import os
from typing import Any
import signal
import subprocess
import sys
from pathlib import Path

import trio

from codesdk.protocol import (
    BudgetGate,
    AuthModel,
    CancellationModel,
    McpSupport,
    PermissionModel,
    ReplaySafety,
    ResumeModel,
    StateModel,
    InputDelivery,
    SendInputParams,
    SteeringSupport,
    ToolExecution,
    AuthState,
    AuthStatus,
    BlockKind,
    CancellationSupport,
    GrantScope,
    ErrorCode,
    EventType,
    ExecutedBy,
    InteractionMode,
    IsolationMode,
    Method,
    ModelOutputCompleted,
    ModelOutputDelta,
    Notification,
    QuestionRequested,
    QuestionSource,
    ResumeMode,
    RuntimeCapabilities,
    RuntimeEventParams,
    RuntimeInfo,
    RuntimeRequestCompleted,
    RuntimeRequestStarted,
    StartTaskParams,
    TaskFailureCode,
    ToolCallCompleted,
    ToolCallRequested,
    ToolCallStarted,
    ToolRouting,
    UsageReported,
    WorkerEvent,
    canonical_hash,
    encode_message,
    render_history,
    split_prompt,
)

from ...command import TEST_STEPS_ENV
from .._questions import AnswersQuestions, PendingQuestions
from .._tool_calls import AnswersToolCalls, PendingToolCalls, ToolOutcome
from .._grace import BadGrace, stop_grace
from .._steering import InputInbox, delivered
from ..runtime_process import RuntimeProcess
from ..base import RuntimeAdapter, StartTaskRefused, TaskHandle, TaskIO, TaskOutcome
from .scenario import (
    AwaitInputStep,
    AskStep,
    CodeStep,
    CompleteStep,
    CrashStep,
    EchoPromptStep,
    FailStep,
    FloodStep,
    HangStep,
    IgnoreStopStep,
    MalformedLineStep,
    OversizedLineStep,
    PolluteStdoutStep,
    RuntimeProcessStep,
    Scenario,
    ScenarioError,
    SleepStep,
    SpawnStep,
    Step,
    TextStep,
    ThinkingStep,
    ToolCallSpec,
    ToolCallsStep,
    TornFrameStep,
    UsageStep,
    default_scenario_dir,
    load_scenario,
    scenario_names,
    parse_scenario,
)

VERSION = "1.0"
DEFAULT_SCENARIO = "echo"
#: Steps that exist to break things on purpose: a tenant may not use them unless the operator enabled them.
TEST_INSTRUMENTS = (CrashStep, HangStep, FloodStep, MalformedLineStep, OversizedLineStep, TornFrameStep,
                    PolluteStdoutStep, IgnoreStopStep, SpawnStep, RuntimeProcessStep)


#: The ``runtime_config`` keys a scripted task takes (its offer declares them, with the scenarios it has).
SCRIPTED_CONFIG_KEYS = ("scenario", "scenario_inline", "stop_grace_s")


class ScriptedAdapter(RuntimeAdapter):
    name = "scripted"

    def __init__(self, scenario_dir: Path | None = None) -> None:
        self.scenario_dir = scenario_dir or default_scenario_dir()

    def capabilities(self) -> RuntimeCapabilities:
        return RuntimeCapabilities(
            name=self.name,
            version=VERSION,
            isolation_modes=(IsolationMode.IN_PROCESS,),
            requires_auth=False,
            auth_methods=("none",),
            streaming_text=True,
            streaming_thinking=True,
            tool_calls=True,
            parallel_tool_calls=True,
            tool_routing=(ToolRouting.IN_BAND,),
            interaction_modes=tuple(InteractionMode),
            approval_scopes=(GrantScope.ONCE,),  # no runtime-side grants: the supervisor enforces every scope
            session_create=True,
            session_resume=True,
            transcript_input=True,
            cancellation=CancellationSupport.COOPERATIVE,
            usage_reporting=True,
            budget_gate=BudgetGate.BEFORE_REQUEST,  # its usage is reported before its next step asks anything
            context_window_tokens=100_000,
            models=("scripted-1",),
            default_model="scripted-1",
            auth_model=AuthModel.NONE,
            tool_execution=ToolExecution.EXTERNAL,
            permission_model=PermissionModel.CODESDK,
            state_model=StateModel.IN_PROCESS,
            resume_model=ResumeModel.RECONSTRUCT,  # it keeps nothing between tasks: it is given the transcript
            tool_replay=ReplaySafety.SAFE_REPLAY,
            mcp_support=McpSupport.NONE,
            cancellation_model=CancellationModel.GUARANTEED,  # it plays in the worker: a stop ends the scenario
            steering=SteeringSupport.MID_TURN,  # an input goes into its next request (``await_input`` waits for one)
            user_questions=(QuestionSource.SCRIPTED,),  # its ``ask`` step
            **self._config_offer(),
        )

    def _config_offer(self) -> dict[str, Any]:
        """The keys and scenarios a task may name here: with the test instruments off (the service's default),
        neither ``scenario_inline`` nor a scenario that uses an instrument, so both are refused before a task is
        stored rather than failing once it is."""
        if os.environ.get(TEST_STEPS_ENV) == "1":
            return {"config_keys": SCRIPTED_CONFIG_KEYS,
                    "config_choices": {"scenario": scenario_names(self.scenario_dir)}}
        plain, withheld = [], {"scenario_inline": _WITHHELD}
        for name in scenario_names(self.scenario_dir):
            try:  # read as plain JSON: validating every scenario would cost each worker's start ~40 ms
                steps = json.loads((self.scenario_dir / f"{name}.json").read_text(encoding="utf-8"))["steps"]
                if not _raw_instruments_in(steps):
                    plain.append(name)
                else:
                    withheld[f"scenario={name}"] = _WITHHELD
            except (OSError, ValueError, KeyError, TypeError):
                plain.append(name)  # offered: its own start says what is wrong with it
        return {"config_keys": tuple(k for k in SCRIPTED_CONFIG_KEYS if k != "scenario_inline"),
                "config_choices": {"scenario": tuple(plain)}, "config_withheld": withheld}

    async def auth_status(self) -> AuthStatus:
        return AuthStatus(runtime=self.name, state=AuthState.NOT_REQUIRED, method="none",
                          message="the scripted runtime needs no credentials")

    def start_task(self, params: StartTaskParams, io: TaskIO) -> TaskHandle:
        config = params.runtime_config
        instruments = os.environ.get(TEST_STEPS_ENV) == "1"
        try:
            if "scenario_inline" in config:
                if not instruments:
                    raise ScenarioError(_INSTRUMENTS_OFF.format(what="runtime_config.scenario_inline"))
                scenario = parse_scenario(config["scenario_inline"])
            else:
                name = config.get("scenario", DEFAULT_SCENARIO)
                if not isinstance(name, str):
                    raise ScenarioError("runtime_config.scenario must be a scenario name (string)")
                scenario = load_scenario(name, self.scenario_dir)
            if not instruments and (used := _instruments_in(scenario.steps)):
                raise ScenarioError(_INSTRUMENTS_OFF.format(what=f"scenario {scenario.name!r} (its {used} step)"))
        except ScenarioError as exc:
            raise StartTaskRefused(ErrorCode.INVALID_SCENARIO, str(exc)) from None
        try:
            grace = stop_grace(config, ScriptedTask.stop_grace_s)
        except BadGrace as exc:
            raise StartTaskRefused(ErrorCode.INVALID_RUNTIME_CONFIG, str(exc)) from None
        io.set_runtime_session_id(params.session.runtime_session_id or f"scripted-{params.session.session_id}")
        io.set_model(scenario.model)
        return ScriptedTask(scenario, params, io, float(grace))


_ENABLE_INSTRUMENTS = "an operator enables them with `codesdk-supervisor serve --enable-test-scenarios`"
_WITHHELD = f"is a test instrument, off on this supervisor; {_ENABLE_INSTRUMENTS}"
_INSTRUMENTS_OFF = ("{what} is a test instrument, off on this supervisor; an operator enables fault-injection "
                    "steps and inline scenarios with `codesdk-supervisor serve --enable-test-scenarios`")


#: The key that names each test-instrument step in a scenario file (``{"hang": …}``).
_INSTRUMENT_KEYS = frozenset(next(iter(kind.model_fields)) for kind in TEST_INSTRUMENTS)


def _raw_instruments_in(steps: object) -> bool:
    """Whether a scenario file's ``steps`` (plain JSON) use a test instrument, also inside tool-call branches —
    ``_instruments_in`` without validating the file."""
    if not isinstance(steps, list):
        return False
    for step in steps:
        if isinstance(step, dict):
            if _INSTRUMENT_KEYS & step.keys():
                return True
            if any(_raw_instruments_in(step.get(branch)) for branch in ("on_denied", "on_error", "on_declined")):
                return True
    return False


def _instruments_in(steps: tuple[Step, ...]) -> str | None:
    """The kind of the first test-instrument step (also inside tool-call branches), if any."""
    for step in steps:
        if isinstance(step, TEST_INSTRUMENTS):
            return next(iter(type(step).model_fields))
        branches = (step.on_denied, step.on_error) if isinstance(step, ToolCallsStep) else \
            (step.on_declined,) if isinstance(step, AskStep) else ()
        for branch in branches:
            if branch and (found := _instruments_in(branch)):
                return found
    return None


class _Template:
    """Fills ``{{prompt}}``, ``{{result:id}}`` and ``{{denied:id}}`` from what the task has seen."""

    def __init__(self, prompt: str, history: str) -> None:
        self.values: dict[str, str] = {"prompt": prompt, "history": history}

    def record(self, call_id: str, outcome: ToolOutcome) -> None:
        if outcome.denied:
            self.values[f"denied:{call_id}"] = outcome.reason or "denied"
        else:
            result = outcome.result
            self.values[f"result:{call_id}"] = result if isinstance(result, str) else json.dumps(result)
            if isinstance(result, dict):  # {{result:id.field}} picks one top-level field
                for key, value in result.items():
                    self.values[f"result:{call_id}.{key}"] = value if isinstance(value, str) else json.dumps(value)

    def render(self, text: str) -> str:
        for key, value in self.values.items():
            text = text.replace("{{" + key + "}}", value)
        return text


class ScriptedTask(AnswersToolCalls, AnswersQuestions, TaskHandle):
    def __init__(self, scenario: Scenario, params: StartTaskParams, io: TaskIO, stop_grace_s: float) -> None:
        self.scenario = scenario
        self.params = params
        self.io = io
        self.stop_grace_s = stop_grace_s
        self.tools = PendingToolCalls()
        self.questions = PendingQuestions()
        history, prompt = split_prompt(params.messages)
        self.template = _Template(prompt, render_history(history))
        self.template.values["input"] = ""
        self.inbox = InputInbox()
        self._last_tool_call: str | None = None
        self._awaited = 0
        # The scripted runtime keeps nothing between tasks: the messages it is given are all it knows.
        self.resume = ResumeMode.RECONSTRUCTED if history else ResumeMode.NEW
        self.sent_hash = canonical_hash([m.to_json_obj() for m in params.messages])
        self._block_counter = 0
        self._request_counter = 0
        self._in_request: str | None = None
        self._ignore_stop = False
        self._last_text = ""  # the last text/code block, for the completion's preview
        self._scope = trio.CancelScope()
        self._stop_reason: str | None = None
        self.implicit_sources = {"policy": "the scripted runtime loads nothing implicitly", "found": []}

    # -- inputs (tool answers: AnswersToolCalls) ----------------------------------------------

    def send_input(self, params: SendInputParams) -> InputDelivery:
        self.inbox.put(params)  # its next model request carries it
        return InputDelivery.MID_TURN

    def stop(self, reason: str | None) -> None:
        self._stop_reason = self._stop_reason or reason or "stop requested"  # the first stop says why
        if not self._ignore_stop:
            self._scope.cancel()

    # -- playing --------------------------------------------------------------------------------

    async def run(self) -> TaskOutcome:
        outcome: TaskOutcome | None = None
        with self._scope:
            outcome = await self._play(self.scenario.steps)
        if outcome is None:  # the scope was cancelled by a cooperative stop
            return TaskOutcome.stop(self._stop_reason or "stop requested")
        return outcome

    async def _play(self, steps: tuple[Step, ...]) -> TaskOutcome:
        for step in steps:
            outcome = await self._step(step)
            if outcome is not None:
                return outcome
        await self._end_request("end_turn")
        return TaskOutcome.success(result_preview=self._last_text[-200:])

    async def _step(self, step: Step) -> TaskOutcome | None:
        match step:
            case TextStep():
                await self._stream_block(BlockKind.TEXT, self.template.render(step.text), step.chunk_size,
                                         delay_s=step.delay_s)
            case AwaitInputStep():
                await self._end_request("pause_turn")
                self._awaited += 1  # one more input than the steps before awaited (it may have come already)
                await self.inbox.wait(self._awaited)
                if step.await_input is True:
                    await self._begin_request()  # the next request, carrying it
            case EchoPromptStep():
                await self._stream_block(BlockKind.TEXT, self.template.values["prompt"], 16)
            case CodeStep():
                await self._stream_block(BlockKind.CODE, self.template.render(step.code), step.chunk_size,
                                         language=step.language)
            case ThinkingStep():
                await self._stream_block(BlockKind.THINKING, step.thinking, 32)
            case ToolCallsStep():
                return await self._tool_calls(step)
            case AskStep():
                return await self._ask(step)
            case UsageStep():
                await self.io.emit(EventType.USAGE_REPORTED, UsageReported(model=self.scenario.model, **step.usage.model_dump()))
            case CompleteStep():
                await self._end_request(step.complete.get("stop_reason", "end_turn"))
                return TaskOutcome.success(step.complete.get("stop_reason", "end_turn"), self._last_text[-200:])
            case FailStep():
                await self._end_request("error")
                fail = dict(step.fail)
                return TaskOutcome.failure(
                    str(fail.pop("code", "RUNTIME_ERROR")), str(fail.pop("message", "scripted failure")),
                    bool(fail.pop("retryable", False)), **fail,
                )
            case SleepStep():
                await trio.sleep(step.sleep)
            case HangStep():
                await trio.sleep_forever()
            case IgnoreStopStep():
                self._ignore_stop = True
            case CrashStep():
                await self.io.flush()
                _crash(step.crash.exit_code, step.crash.signal)
            case FloodStep():
                block_id = self._new_block_id()
                emit, delta_type, delta = self.io.emit, EventType.MODEL_OUTPUT_DELTA, step.delta  # per line: hoisted
                for index in range(step.flood):
                    await emit(delta_type, ModelOutputDelta(block_id=block_id, delta=delta, index=index))
                await self.io.emit(EventType.MODEL_OUTPUT_COMPLETED,
                                   ModelOutputCompleted(block_id=block_id, text=step.delta * step.flood))
            case MalformedLineStep():
                await self.io.write_raw(step.malformed_line.encode() + b"\n")
            case OversizedLineStep():
                await self.io.write_raw(b'{"pad":"' + b"x" * max(0, step.oversized_line - 10) + b'"}\n')
            case TornFrameStep():
                line = self._event_line(ModelOutputDelta(block_id=self._new_block_id(), delta="torn", index=0))
                await self.io.write_raw(line[:len(line) // 2])
            case PolluteStdoutStep():
                await _pollute_stdout(step.pollute_stdout)
            case RuntimeProcessStep():
                await self.io.flush()  # what came before is on the wire before the process can die
                async with RuntimeProcess.open(step.runtime_process, env=os.environ, cwd=self.params.workspace,
                                               name="scripted runtime process") as process:
                    status = await process.wait()
                    if status.exit_code != 0:
                        raise process.crashed()
            case SpawnStep():
                try:  # never waited for: it is left running on purpose
                    await trio.lowlevel.open_process(list(step.spawn), stdin=subprocess.DEVNULL,
                                                     stdout=subprocess.DEVNULL, start_new_session=step.new_session)
                except OSError as exc:
                    return TaskOutcome.failure(TaskFailureCode.INVALID_SCENARIO, f"spawn {step.spawn[0]!r}: {exc}")
        return None

    async def _ask(self, step: AskStep) -> TaskOutcome | None:
        """Ask the user and wait for the answer, as a model's question tool would."""
        await self._begin_request()
        ask_id = self.questions.new_ask_id()
        self.questions.expect(ask_id)
        questions = tuple(q.model_copy(update={"text": self.template.render(q.text)}) for q in step.ask.questions)
        await self.io.emit(EventType.QUESTION_REQUESTED, QuestionRequested(
            question_id=ask_id, source=QuestionSource.SCRIPTED, message=self.template.render(step.ask.message),
            questions=questions))
        await self._end_request("tool_use")
        answer = await self.questions.wait(ask_id)
        if answer.declined:
            self.template.values["declined"] = answer.reason or "declined"
            if step.on_declined is not None:
                return await self._play(step.on_declined)
            return None
        for key, value in answer.answers.items():
            text = ", ".join(value) if isinstance(value, list) else value if isinstance(value, str) else \
                json.dumps(value)
            self.template.values[f"answer:{key}"] = text
        return None

    async def _run_builtin(self, call: ToolCallSpec) -> ToolOutcome:
        """Pretend to run one of the runtime's own tools, reporting it as a real runtime would."""
        identity = {"tool_call_id": call.id, "runtime_tool_call_id": call.id, "input_hash": canonical_hash(call.input)}
        await self.io.emit(EventType.TOOL_CALL_STARTED, ToolCallStarted(
            **identity, tool_name=call.name, executed_by=ExecutedBy.RUNTIME, execution_env="runtime:scripted"))
        result = f"{call.name} ran inside the scripted runtime"
        await self.io.emit(EventType.TOOL_CALL_COMPLETED, ToolCallCompleted(
            **identity, tool_name=call.name, executed_by=ExecutedBy.RUNTIME, execution_env="runtime:scripted",
            result_preview=result))
        return ToolOutcome(result=result)

    def _event_line(self, payload: ModelOutputDelta) -> bytes:
        """A complete ``runtime.event`` line as the worker would write it (used to tear one)."""
        event = WorkerEvent(type=EventType.MODEL_OUTPUT_DELTA, runtime=RuntimeInfo(name="scripted"), payload=payload)
        params = RuntimeEventParams(task_id=self.params.task_id, n=1, event=event)
        return encode_message(Notification(method=Method.EVENT, params=params.to_json_obj()))

    def _new_block_id(self) -> str:
        self._block_counter += 1
        return f"{self.params.task_id}:b{self._block_counter}"

    async def _begin_request(self) -> None:
        if self._in_request is None:
            self._request_counter += 1
            self._in_request = f"{self.params.task_id}:r{self._request_counter}"
            if self.inbox:  # what the user added since the last request goes into this one, before it
                inputs = self.inbox.take()
                self.template.values["input"] = "\n\n".join(i.text() for i in inputs)
                await delivered(self.io, inputs, before_request_id=self._in_request,
                                after_tool_call_id=self._last_tool_call)
            await self.io.emit(EventType.RUNTIME_REQUEST_STARTED,
                               RuntimeRequestStarted(request_id=self._in_request, model=self.scenario.model))

    async def _end_request(self, stop_reason: str) -> None:
        if self._in_request is not None:
            request_id, self._in_request = self._in_request, None
            await self.io.emit(EventType.RUNTIME_REQUEST_COMPLETED,
                               RuntimeRequestCompleted(request_id=request_id, stop_reason=stop_reason))

    async def _stream_block(self, kind: BlockKind, text: str, chunk_size: int, *,
                            language: str | None = None, delay_s: float = 0.0) -> None:
        await self._begin_request()
        block_id = self._new_block_id()
        for index, start in enumerate(range(0, len(text), chunk_size)):
            if delay_s:
                await trio.sleep(delay_s)
            await self.io.emit(EventType.MODEL_OUTPUT_DELTA, ModelOutputDelta(
                block_id=block_id, kind=kind, delta=text[start:start + chunk_size], index=index, language=language))
        await self.io.emit(EventType.MODEL_OUTPUT_COMPLETED,
                           ModelOutputCompleted(block_id=block_id, kind=kind, text=text, language=language))
        if kind != BlockKind.THINKING:
            self._last_text = text

    async def _tool_calls(self, step: ToolCallsStep) -> TaskOutcome | None:
        await self._begin_request()
        for call in step.tool_calls:
            self.tools.expect(call.id)
        for call in step.tool_calls:
            await self.io.emit(EventType.TOOL_CALL_REQUESTED, ToolCallRequested(
                tool_call_id=call.id, runtime_tool_call_id=call.id, input_hash=canonical_hash(call.input),
                tool_name=call.name, input=call.input, executed_by=ExecutedBy(call.executed_by)))
        await self._end_request("tool_use")
        outcomes: dict[str, ToolOutcome] = {}

        async def wait_for(call_id: str) -> None:
            outcomes[call_id] = await self.tools.wait(call_id)

        async with trio.open_nursery() as nursery:
            for call in step.tool_calls:
                nursery.start_soon(wait_for, call.id)
        self._last_tool_call = step.tool_calls[-1].id
        for call in step.tool_calls:  # in request order, whatever order the answers came in
            outcome = outcomes[call.id]
            if outcome.approved:  # a built-in of "the runtime": it runs it itself and reports
                outcome = await self._run_builtin(call)
                outcomes[call.id] = outcome
            self.template.record(call.id, outcome)
        if step.on_denied is not None and any(o.denied for o in outcomes.values()):
            return await self._play(step.on_denied)
        if step.on_error is not None and any(o.is_error for o in outcomes.values()):
            return await self._play(step.on_error)
        return None


_CHILD_WRITES_STDOUT = "import sys; sys.stdout.write(sys.argv[1] + ' (child process)\\n')"


async def _pollute_stdout(text: str) -> None:
    """Print to stdout by every route a runtime or library has; each piece is tagged with its route."""
    print(f"{text} (print)", flush=True)
    if sys.__stdout__ is not None:
        print(f"{text} (sys.__stdout__)", file=sys.__stdout__, flush=True)
    os.write(1, f"{text} (fd 1)\n".encode())
    os.write(1, b'{"jsonrpc":"2.0","method":')  # no newline: on the wire, it would tear the next frame
    await trio.run_process([sys.executable, "-c", _CHILD_WRITES_STDOUT, text], stdin=subprocess.DEVNULL)


def _crash(exit_code: int | None, signal_name: str | None) -> None:
    """End the process abruptly, as a runtime crash would: no cleanup, no goodbye."""
    sys.stderr.write(f"scripted runtime: crashing on purpose (exit_code={exit_code}, signal={signal_name})\n")
    sys.stderr.flush()
    if signal_name is not None:
        os.kill(os.getpid(), getattr(signal, signal_name))
    os._exit(exit_code if exit_code is not None else 1)
