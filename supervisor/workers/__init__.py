"""Worker processes as seen from the supervisor: the JSON-RPC connection, one process, the pool."""

from ..worker_launch import worker_argv
from .connection import (
    InvalidResult,
    ProtocolViolation,
    RpcError,
    WorkerBroken,
    WorkerClosed,
    WorkerConnection,
    WorkerError,
)
from .process import WorkerProcess, WorkerSpec, WorkerStartError

__all__ = [
    "InvalidResult", "ProtocolViolation", "RpcError", "WorkerBroken", "WorkerClosed",
    "WorkerConnection", "WorkerError", "WorkerProcess", "WorkerSpec", "WorkerStartError", "worker_argv",
]
