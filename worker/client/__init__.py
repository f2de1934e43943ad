"""The other end of a worker: start ``codesdk-worker`` (or any worker command) in a session of its own, or adopt one
started already, complete its handshake, and speak the protocol to it (requests, its event stream, the violations
it commits), then end its whole process tree.

Used by the supervisor's worker pool and by the test kit (``codesdk.testing``); the worker itself never imports it.
"""

from ..command import worker_argv
from ._connection import (
    EVENT_BUFFER,
    VIOLATION_LOGS_PER_WINDOW,
    VIOLATIONS_KEPT,
    ConnectionStats,
    InvalidResult,
    ProtocolViolation,
    RpcError,
    WorkerBroken,
    WorkerClosed,
    WorkerConnection,
    WorkerError,
)
from ._process import (
    HANDSHAKE_TIMEOUT_S,
    REAP_WAIT_S,
    RESOURCE_ERRNOS,
    WorkerProcess,
    WorkerResourcesExhausted,
    WorkerSpec,
    WorkerStartError,
    check_descriptor_headroom,
    exhausted_message,
)

__all__ = [
    "EVENT_BUFFER", "HANDSHAKE_TIMEOUT_S", "REAP_WAIT_S", "RESOURCE_ERRNOS", "VIOLATIONS_KEPT",
    "VIOLATION_LOGS_PER_WINDOW", "ConnectionStats", "InvalidResult", "ProtocolViolation", "RpcError",
    "WorkerBroken", "WorkerClosed", "WorkerConnection", "WorkerError", "WorkerProcess",
    "WorkerResourcesExhausted", "WorkerSpec", "WorkerStartError", "check_descriptor_headroom", "exhausted_message",
    "worker_argv",
]
