"""The tool flow's port: all it may reach of the engine, so it runs (and is tested) with no engine or worker.

``ToolFlowPort`` is what one tool call needs: store events for its task run, store and read blobs, read the
session's earlier tool calls (for replays), the tool registry, approvals, and a way to answer the runtime.
``EnginePort`` is the engine's implementation over the store, the run recorder and the task's worker.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from codesdk.protocol import Ack, ApprovalState, GrantCreated, MethodSpec, Model, NormalizedEvent, ToolSpec

from ..store import ApprovalRecord, Recorder, SessionRecord
from ..tools import ApprovalRequest, ApproverAnswer, ToolContext, ToolRegistry, ToolResult
from codesdk.worker.client import WorkerError
from ._approvals import ApprovalBroker
from ._grants import GrantBook
from ._recorder import RunRecorder
from ._runs import Blobs, PendingEvent, TaskRun

#: A request that answers a runtime about one of its calls (``Rpc.SEND_TOOL_RESULT`` / ``_DENIED`` / ``_APPROVED``).
ToolAnswer = MethodSpec[Model, Ack]

log = logging.getLogger("codesdk.supervisor.tools")


class ToolRunner(Protocol):
    """The tools a call may use (``ToolRegistry``)."""

    def spec(self, name: str) -> ToolSpec | None: ...
    def manifest_hash(self) -> str: ...
    @property
    def unattended_network(self) -> bool: ...
    async def execute(self, name: str, input: Any, ctx: ToolContext) -> ToolResult: ...


class Approvals(Protocol):
    """Where an "ask" waits for a decision (``ApprovalBroker``)."""

    async def open(self, run: TaskRun, request: ApprovalRequest, *, runs_here: bool = True) -> ApprovalRecord: ...
    def answer_of(self, approval_id: str) -> ApproverAnswer | None: ...
    async def wait(self, run: TaskRun, record: ApprovalRecord, request: ApprovalRequest) -> ApprovalRecord: ...
    async def close(self, approval_id: str, why: str,
                    state: ApprovalState = ApprovalState.EXPIRED) -> ApprovalRecord: ...
    async def close_for_end(self, run: TaskRun, approval_id: str) -> ApprovalRecord: ...


class Grants(Protocol):
    """A session's live grants, for the policy (``GrantBook``)."""

    async def live(self, session: SessionRecord) -> tuple[GrantCreated, ...]: ...
    def noted(self, session_id: str, created: GrantCreated) -> None: ...


class ToolFlowPort(Protocol):
    @property
    def tools(self) -> ToolRunner: ...
    @property
    def approvals(self) -> Approvals: ...
    @property
    def grants(self) -> Grants: ...

    async def append(self, run: TaskRun, events: Sequence[PendingEvent], blobs: Blobs | None = None) -> bool:
        """Store ``events`` of ``run`` (with the small ``blobs`` they name) in one commit; False once it ended."""
        ...

    async def put_blob(self, run: TaskRun, data: bytes, media_type: str) -> str:
        """Store a blob an event of ``run`` will name (its session holds it from now on)."""
        ...
    async def get_blob(self, ref: str) -> bytes: ...

    async def read_types(self, session_id: str, types: Sequence[str], after_seq: int,
                         limit: int) -> Sequence[NormalizedEvent]:
        """Up to ``limit`` stored events of these types after ``after_seq``, in order."""
        ...

    async def answer(self, run: TaskRun, method: ToolAnswer, params: Model) -> None:
        """Send the runtime a request about one of its calls (result, denial, approval); best effort."""
        ...


class EnginePort:
    def __init__(self, store: Recorder, recorder: RunRecorder, tools: ToolRegistry,
                 approvals: ApprovalBroker, grants: GrantBook) -> None:
        self.store = store
        self.recorder = recorder
        self.tools = tools
        self.approvals = approvals
        self.grants = grants

    async def append(self, run: TaskRun, events: Sequence[PendingEvent], blobs: Blobs | None = None) -> bool:
        return await self.recorder.append(run, events, blobs)

    async def put_blob(self, run: TaskRun, data: bytes, media_type: str) -> str:
        return await self.store.put_blob(data, media_type, session_id=run.session_id)

    async def get_blob(self, ref: str) -> bytes:
        return await self.store.get_blob(ref)

    async def read_types(self, session_id: str, types: Sequence[str], after_seq: int,
                         limit: int) -> Sequence[NormalizedEvent]:
        return await self.store.read_types(session_id, types, after_seq, limit)

    async def answer(self, run: TaskRun, method: ToolAnswer, params: Model) -> None:
        if run.worker is None:
            return
        try:
            await run.worker.connection.request(method, params)
        except WorkerError as exc:  # the worker is gone: its exit fails the task
            log.info("task %s: %s not delivered: %s", run.task_id, method.method, exc)
