"""CodeSDK for applications: a client of a running ``codesdk-supervisor`` (``AsyncClient``, ``Client``; see
``codesdk.client``).

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

__all__ = ["ApiError", "AsyncClient", "Client", "Conflict", "Forbidden", "InvalidRequest", "NamespaceElsewhere",
           "NotFound", "ServiceUnreachable", "TooManyRequests", "Unauthorized", "__version__"]


def __getattr__(name: str) -> object:
    if name in __all__:
        return getattr(import_module(".client", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
