"""CodeSDK for applications: a client of a running ``codesdk-supervisor`` (see ``codesdk.client``)."""

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
           "NotFound", "ServiceUnreachable", "TooManyRequests", "Unauthorized"]
