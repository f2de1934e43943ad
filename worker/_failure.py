"""A refused request, as the worker answers it: its JSON-RPC error. Adapters raise it too (``StartTaskRefused``),
so every refusal reaches the peer through one path."""

from __future__ import annotations

from typing import Any

from codesdk.protocol import ErrorCode, IncomingId, encode_message


class _Omitted:
    """The ``data`` of an error that has none: the member is left out (``None`` is sent as ``"data": null``)."""


OMITTED = _Omitted()


class RpcFailure(Exception):
    """A request refused: answered with this JSON-RPC error (``data`` left out when OMITTED)."""

    def __init__(self, code: ErrorCode | int, message: str, data: Any = OMITTED) -> None:
        super().__init__(message)
        self.code = int(code)
        self.message = message
        self.data = data

    def error_object(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not OMITTED:
            error["data"] = self.data
        return error

    def line(self, request_id: IncomingId) -> bytes:
        """The response line answering ``request_id`` with this error."""
        return encode_message({"jsonrpc": "2.0", "error": self.error_object(), "id": request_id})
