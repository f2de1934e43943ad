"""The one place the service's own records become the API's typed answers (``codesdk.protocol.api``): the store's
rows and the pool's status never reach the wire as they are, so a change to either cannot change the API."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from codesdk.protocol import api

from ..namespaces import EnvEntry
from ..store import ApprovalRecord, SessionRecord, TaskRecord


def session_answer(record: SessionRecord) -> api.Session:
    return api.Session(session_id=record.session_id, runtime=record.runtime, namespace=record.namespace,
                       workspace=record.workspace, created_at=record.created_at, metadata=record.metadata,
                       runtime_session_id=record.runtime_session_id, last_seq=record.last_seq)


def task_answer(record: TaskRecord) -> api.Task:
    return api.Task(task_id=record.task_id, session_id=record.session_id, state=api.TaskState(record.state),
                    runtime=record.runtime, created_at=record.created_at, started_at=record.started_at,
                    ended_at=record.ended_at, worker_pid=record.worker_pid, terminal_type=record.terminal_type,
                    error=record.error, metadata=record.metadata)


def approval_answer(record: ApprovalRecord) -> api.Approval:
    return api.Approval(approval_id=record.approval_id, session_id=record.session_id, task_id=record.task_id,
                        namespace=record.namespace, tool_call_id=record.tool_call_id, attempt=record.attempt,
                        tool_name=record.tool_name, tool_class=record.tool_class, input=record.input,
                        reason=record.reason, state=record.state, created_at=record.created_at,
                        expires_at=record.expires_at, decided_at=record.decided_at, decided_by=record.decided_by,
                        decision_reason=record.decision_reason)


def worker_answer(status: Mapping[str, object]) -> api.WorkerState:
    """One row of ``WorkerPool.status()``."""
    return api.WorkerState.model_validate(status)


def env_answer(namespace: str, entries: Sequence[EnvEntry]) -> api.EnvList:
    return api.EnvList(namespace=namespace, variables=tuple(
        api.EnvVariable(name=entry.name, fingerprint=entry.fingerprint) for entry in entries))
