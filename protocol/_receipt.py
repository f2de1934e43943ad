"""A stop's receipt: what was done to stop a task, and what was verified, stored with its ``task.stopped``.

The worker writes its part into its own ``task.stopped`` (the interrupt, whether the runtime honoured it within its
grace, each runtime process and how it was ended, checked gone); the supervisor adds its own (the worker's answer,
the task's tool calls in flight and how each ended) and stores the whole with the task's one terminal event.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from ._base import Model

#: The longest grace a task may give its runtime to stop by itself (``runtime_config.stop_grace_s``): a stop waits
#: for it, and so do the session and its caller.
MAX_STOP_GRACE_S = 60.0


class EscapedProcess(Model):
    """A process a runtime started and moved out of its process group, SIGKILLed when the runtime was ended."""

    pid: int
    command: str  # its command line as it ran ("" if it could not be read), at most 500 characters


class ProcessEnd(Model):
    """One runtime process of the task, as it was ended."""

    name: str
    pid: int
    exit: str  # how it ended: "exited with code 0", "killed by signal SIGKILL"
    term_sent: bool = False  # SIGTERM sent to its process group
    kill_sent: bool = False  # SIGKILL sent to its process group (the TERM grace ran out)
    escaped_killed: int = Field(default=0, ge=0)  # processes it started outside its group, SIGKILLed
    gone: bool  # checked after the end: nothing left in its process group, none of the escaped alive
    escaped: tuple[EscapedProcess, ...] = ()  # which they were (escaped_killed of them), first 20


class CallStage(StrEnum):
    """Where a tool call was when the stop came."""

    DECIDING = "deciding"  # requested; the policy had not decided
    AWAITING_APPROVAL = "awaiting_approval"
    RUNNING = "running"  # approved; the supervisor was running it
    RUNNING_IN_RUNTIME = "running_in_runtime"  # approved; the runtime runs it itself


class CallEnding(StrEnum):
    COMPLETED = "completed"  # it finished before the stop took effect (its result is stored)
    NEVER_RUN = "never_run"  # it had not started: it never will (a pending approval is closed)
    CANCELLED = "cancelled"  # the supervisor cut its run short (its processes ended with it)
    ENDED_WITH_RUNTIME = "ended_with_runtime"  # the runtime's own run of it ended with the runtime's processes


class CallInFlight(Model):
    tool_call_id: str
    tool_name: str
    stage: CallStage
    ended: CallEnding


class WorkerAnswer(StrEnum):
    CONFIRMED = "confirmed"  # the worker ended the task and said how
    NO_ANSWER = "no_answer"  # the worker did not end the task in time: it is on its own (the pool's watch applies)
    EXITED = "exited"  # the worker process ended: every process of its group went with it
    NOT_STARTED = "not_started"  # the task had not reached a worker


class StopReceipt(Model):
    """What a stop did and verified. The worker's fields are None where the worker did not say (no answer)."""

    worker: WorkerAnswer | None = None  # the supervisor's finding; None in the worker's own part
    worker_detail: str = ""
    interrupt_sent: bool | None = None  # the runtime was asked to stop
    acknowledged: bool | None = None  # the runtime ended the task by itself within the grace
    forced: bool | None = None  # the grace ran out: the worker cancelled the task by force
    grace_s: float | None = None
    runtime_ended_as: str | None = None  # the worker's terminal event, when it was not task.stopped
    processes: tuple[ProcessEnd, ...] = ()
    #: Every runtime process of the task checked gone (None: not known — no answer, or it ran none).
    processes_gone: bool | None = None
    tool_calls: tuple[CallInFlight, ...] = ()
    worker_ms: float | None = Field(default=None, ge=0)  # from the worker's stop request to the task's end there
    duration_ms: float | None = Field(default=None, ge=0)  # from the supervisor's stop request to the receipt
