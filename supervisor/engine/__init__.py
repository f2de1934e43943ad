"""The task engine: sessions, tasks, events, tool calls — the invariants of the contract live here."""

from ..tools import ApprovalRequest, Approver, ApproverAnswer
from ._engine import Engine, EngineConfig, EngineError, EngineStats, InvalidTaskInput, TaskNotActive

__all__ = ["ApprovalRequest", "Approver", "ApproverAnswer", "Engine", "EngineConfig", "EngineError", "EngineStats",
           "InvalidTaskInput", "TaskNotActive"]
