"""One in-process ASGI GET on the API's app: for tests that need an answer of the app, not a served socket."""

from __future__ import annotations

from typing import Any


async def asgi_get(app: Any, path: str, token: str | None = None) -> tuple[int, bytes]:
    """The status and body of ``GET path`` (with ``token`` as its bearer, if given)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    scope: dict[str, Any] = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(),
                             "query_string": b"", "headers": headers, "http_version": "1.1", "scheme": "http",
                             "server": ("test", 80), "client": None, "root_path": ""}
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
