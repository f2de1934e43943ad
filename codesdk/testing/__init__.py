"""CodeSDK's test kit: drive a worker over its pipes, check event streams, and hold a worker to the protocol.

- ``open_worker`` (trio) / ``run_worker`` (blocking): start any worker command — CodeSDK's ``codesdk-worker`` by
  default, or a third party's — do the handshake, start tasks, wait for events, answer tool calls, stop, shut
  down; the worker's whole process tree is reaped however the test ends.
- ``codesdk.testing.invariants``: the event contract's rules, as checks on a worker's stream or a session's
  stored events.
- ``codesdk.testing.conformance``: the protocol's required behaviours, run against any worker command
  (``codesdk-worker conformance -- CMD …``).
- The pytest plugin (``codesdk.pytest_plugin``, loaded by pytest when CodeSDK is installed): fixtures
  ``worker_home``, ``worker_workspace``, ``open_test_worker``, and the ``loopback_only`` marker.

See docs/testing.md.
"""

from __future__ import annotations

from codesdk.worker.client import ProtocolViolation, RpcError, WorkerStartError

from ._driver import (
    DEFAULT_TIMEOUT_S,
    DrivenTask,
    DriverError,
    ToolAnswer,
    ToolPolicy,
    WorkerDriver,
    WorkerOutputEnded,
    WorkerTimedOut,
    namespace_env,
    open_worker,
)
from ._netns import OUTSIDE_NETNS_REASON, loopback_only
from ._sync import SyncTask, SyncWorkerDriver, run_worker
from ._wire import WireLine, WireLog
from .invariants import InvariantError, check_session, check_task, check_worker_events

__all__ = [
    "DEFAULT_TIMEOUT_S", "OUTSIDE_NETNS_REASON", "DrivenTask", "DriverError", "InvariantError", "ProtocolViolation", "RpcError", "SyncTask",
    "SyncWorkerDriver", "ToolAnswer", "ToolPolicy", "WireLine", "WireLog", "WorkerDriver", "WorkerOutputEnded",
    "WorkerStartError", "WorkerTimedOut", "check_session", "check_task", "check_worker_events", "loopback_only",
    "namespace_env", "open_worker", "run_worker",
]
