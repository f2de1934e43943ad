"""Scenario files for the scripted runtime: a small JSON language of steps, validated by pydantic.

A scenario is ``{"name", "description"?, "model"?, "steps": [step, ...]}``; each step is an object with
exactly one of the keys below. Text may quote earlier answers: ``{{prompt}}`` (last user message),
``{{result:<call id>}}``, ``{{denied:<call id>}}``, ``{{answer:<question id>}}``, ``{{declined}}`` and ``{{input}}``
(the inputs the last request was given).
"""

from __future__ import annotations

import json
import re
import signal
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from codesdk.protocol import MAX_QUESTIONS, Question

SCENARIO_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$")


class _Step(BaseModel):
    # Validators are built when a scenario is first parsed, not when every worker starts (~20 ms of its start).
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class TextStep(_Step):
    """Stream text as model.output.delta chunks, then model.output.completed."""

    text: str
    chunk_size: int = Field(default=16, ge=1)
    delay_s: float = Field(default=0.0, ge=0)


class CodeStep(_Step):
    code: str
    language: str | None = None
    chunk_size: int = Field(default=32, ge=1)


class ThinkingStep(_Step):
    thinking: str


class ToolCallSpec(_Step):
    id: str = Field(min_length=1, max_length=120)
    name: str
    input: dict[str, Any] = Field(default_factory=dict)
    #: "runtime": a built-in tool of the runtime's own — the supervisor only decides; the runtime runs it.
    executed_by: Literal["supervisor", "runtime"] = "supervisor"


class ToolCallsStep(_Step):
    """Request these calls at once (parallel) and wait for every answer.

    If any call is denied (or, with ``on_error``, fails), the branch's steps replace the rest.
    """

    tool_calls: tuple[ToolCallSpec, ...] = Field(min_length=1)
    on_denied: tuple[Step, ...] | None = None
    on_error: tuple[Step, ...] | None = None


class AskSpec(_Step):
    message: str = ""
    questions: tuple[Question, ...] = Field(min_length=1, max_length=MAX_QUESTIONS)


class AskStep(_Step):
    """Ask the user (``question.requested``) and wait for the answer: ``{{answer:<question id>}}`` quotes it
    (several choices joined with ", "), ``{{declined}}`` the reason of a decline. If the question is declined,
    the ``on_declined`` steps replace the rest."""

    ask: AskSpec
    on_declined: tuple[Step, ...] | None = None


class UsageSpec(_Step):
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cache_read_tokens: int = Field(default=0, ge=0)
    cache_write_tokens: int = Field(default=0, ge=0)
    reasoning_tokens: int = Field(default=0, ge=0)


class UsageStep(_Step):
    usage: UsageSpec


class CompleteStep(_Step):
    complete: dict[str, str] = Field(default_factory=dict)


class FailStep(_Step):
    fail: dict[str, Any]


class SleepStep(_Step):
    sleep: float = Field(ge=0)


class HangStep(_Step):
    """Wait forever (until stopped; with ignore_stop, until the worker cancels by force)."""

    hang: Literal[True]


class IgnoreStopStep(_Step):
    """From here on, a stop request is ignored: the scenario keeps playing."""

    ignore_stop: Literal[True]


class CrashSpec(_Step):
    exit_code: int | None = Field(default=None, ge=0, le=255)
    signal: str | None = None

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, value: str | None) -> str | None:
        if value is not None and not isinstance(getattr(signal, value, None), signal.Signals):
            raise ValueError(f"unknown signal {value!r} (use a name such as SIGKILL)")
        return value


class CrashStep(_Step):
    """Flush what was emitted, then end the whole worker process with an exit code or a signal."""

    crash: CrashSpec


class FloodStep(_Step):
    """Emit ``count`` small deltas as fast as the pipe takes them."""

    flood: int = Field(ge=1, le=10_000_000)
    delta: str = "x"


class MalformedLineStep(_Step):
    """Write a line that is not JSON on the protocol stream."""

    malformed_line: str = "this is not json"


class OversizedLineStep(_Step):
    """Write one line of this many bytes (to exceed the reader's frame limit)."""

    oversized_line: int = Field(ge=1, le=256 * 1024 * 1024)


class TornFrameStep(_Step):
    """Write the first half of a valid ``runtime.event`` line, without its newline.

    That is what a worker killed in the middle of a write leaves on the wire: pair it with a crash step.
    """

    torn_frame: Literal[True]


class PolluteStdoutStep(_Step):
    """Write to the process's stdout the ways a runtime or a library might.

    ``print()``, ``sys.__stdout__``, ``os.write(1, …)`` (one piece without a newline, shaped like the
    start of a protocol line) and a child process that inherits stdout. None of it may reach the wire.
    """

    pollute_stdout: str = Field(default="stray output", min_length=1, max_length=4096)


class SpawnStep(_Step):
    """Start a process and leave it running, as a runtime's helper or a tool's daemon would: what the worker's
    teardown must end. With ``new_session`` it leaves the worker's process group too."""

    spawn: tuple[str, ...] = Field(min_length=1)
    new_session: bool = False


class RuntimeProcessStep(_Step):
    """Run a program as the runtime's own process (what a real runtime's CLI is) until it exits: exit 0 carries
    on; any other end — a crash, a kill — fails the task ``RUNTIME_CRASHED`` with the exit status and its stderr
    tail, exactly as a real adapter reports its runtime dying."""

    runtime_process: tuple[str, ...] = Field(min_length=1)


class EchoPromptStep(_Step):
    echo_prompt: Literal[True]


class AwaitInputStep(_Step):
    """End the model request under way and wait for a user's input (``runtime.sendInput``): a new request carries
    it at once, and ``{{input}}`` quotes it. ``"hold"``: the input is left for the next request a later step makes
    (a ``complete`` next leaves it undelivered: carried into the session's next task)."""

    await_input: Literal[True, "hold"]


Step = Annotated[
    TextStep
    | CodeStep
    | ThinkingStep
    | ToolCallsStep
    | AskStep
    | UsageStep
    | CompleteStep
    | FailStep
    | SleepStep
    | HangStep
    | IgnoreStopStep
    | CrashStep
    | FloodStep
    | MalformedLineStep
    | OversizedLineStep
    | TornFrameStep
    | PolluteStdoutStep
    | SpawnStep
    | RuntimeProcessStep
    | EchoPromptStep
    | AwaitInputStep,
    Field(union_mode="left_to_right"),
]

class Scenario(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    name: str
    description: str = ""
    model: str = "scripted-1"
    steps: tuple[Step, ...]


class ScenarioError(ValueError):
    """A scenario can't be found or doesn't validate; the message says which and where."""


def default_scenario_dir() -> Path:
    """The scenarios shipped with this package (``scenarios/``, package data): there in a checkout and in an
    installed wheel alike (wheels install as files, so the resource is a plain directory)."""
    return Path(str(resources.files(__package__ or __name__.rpartition(".")[0]) / "scenarios"))


def scenario_names(directory: Path) -> tuple[str, ...]:
    """The scenarios in ``directory`` (what ``runtime_config.scenario`` may name), sorted."""
    try:
        return tuple(sorted(p.stem for p in directory.glob("*.json") if SCENARIO_NAME.fullmatch(p.stem)))
    except OSError:
        return ()


def load_scenario(name: str, directory: Path) -> Scenario:
    if not SCENARIO_NAME.fullmatch(name):
        raise ScenarioError(f"invalid scenario name {name!r}: use letters, digits, '-' and '_'")
    path = directory / f"{name}.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        known = scenario_names(directory)
        raise ScenarioError(f"no scenario {name!r} in {directory}; known: {', '.join(known) or 'none'}") from None
    except (OSError, ValueError) as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc}") from None
    return parse_scenario(raw, source=str(path))


def parse_scenario(raw: Any, source: str = "inline scenario") -> Scenario:
    try:
        return Scenario.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ScenarioError(f"{source}: {where}: {first['msg']} ({exc.error_count()} problem(s))") from None
