"""CodeSDK for applications: a client of a running ``codesdk-supervisor`` (``AsyncClient``, ``Client``; see
``codesdk.client``) and the API's typed models its answers are (``Session``, ``Task``, ``Approval`` …; all in
``codesdk.protocol.api``).

The client's names are imported on first use: every ``codesdk.*`` import runs this file first — the worker, its MCP
bridge, the ``codesdk`` command's front — and none of those may pay for the HTTP stack (~0.1 s) it never uses.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from ._version import __version__

if TYPE_CHECKING:
    from .client import (
        ApiError,
        AsyncClient,
        Client,
        Conflict,
        Forbidden,
        InvalidRequest,
        NamespaceElsewhere,
        NotFound,
        ServiceUnreachable,
        TooManyRequests,
        Unauthorized,
    )
    from .protocol import EventType, NormalizedEvent
    from .protocol.api import Approval, DeletedSession, Session, SessionState, Task, TaskState, Transcript

_CLIENT = ["ApiError", "AsyncClient", "Client", "Conflict", "Forbidden", "InvalidRequest", "NamespaceElsewhere",
           "NotFound", "ServiceUnreachable", "TooManyRequests", "Unauthorized"]
#: The models an app meets most (the rest: ``codesdk.protocol.api``), importable without the HTTP stack.
_MODELS = {"Approval": ".protocol.api", "DeletedSession": ".protocol.api", "Session": ".protocol.api",
           "SessionState": ".protocol.api", "Task": ".protocol.api", "TaskState": ".protocol.api",
           "Transcript": ".protocol.api", "EventType": ".protocol", "NormalizedEvent": ".protocol"}
__all__ = ["ApiError", "Approval", "AsyncClient", "Client", "Conflict", "DeletedSession", "EventType", "Forbidden",
           "InvalidRequest", "NamespaceElsewhere", "NormalizedEvent", "NotFound", "ServiceUnreachable", "Session",
           "SessionState", "Task", "TaskState", "TooManyRequests", "Transcript", "Unauthorized", "__version__"]


def __getattr__(name: str) -> object:
    if name in _MODELS:
        return getattr(import_module(_MODELS[name], __name__), name)
    if name in _CLIENT:
        return getattr(import_module(".client", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
