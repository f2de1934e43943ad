"""The API's OpenAPI 3.1 document, built from the route table and the pydantic request models (no drift)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from codesdk.protocol import NormalizedEvent

#: (method, path, summary, request body model or None, success status)
Operation = tuple[str, str, str, type[BaseModel] | None, int]


def openapi_document(operations: list[Operation], version: str) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    schemas: dict[str, Any] = {"NormalizedEvent": NormalizedEvent.model_json_schema(),
                               "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                                   "type": "object", "required": ["code", "message"],
                                   "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}}}
    for method, path, summary, body, status in operations:
        operation: dict[str, Any] = {
            "summary": summary,
            "responses": {
                str(status): {"description": "success"},
                "401": {"description": "missing or bad token", "content": _error_ref()},
                "404": {"description": "unknown, or another tenant's", "content": _error_ref()},
                "422": {"description": "invalid request (the message names the field)", "content": _error_ref()},
            },
        }
        if path in ("/healthz", "/readyz"):
            operation["security"] = []
        params = [name.strip("{}") for name in path.split("/") if name.startswith("{")]
        if params:
            operation["parameters"] = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                                       for p in params]
        if body is not None:
            schemas[body.__name__] = body.model_json_schema()
            operation["requestBody"] = {"required": True, "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{body.__name__}"}}}}
        if path.endswith("/events/stream"):
            operation["responses"][str(status)] = {
                "description": "text/event-stream: `id: <seq>`, `event: <type>`, `data: <NormalizedEvent>`; resume "
                               "with the Last-Event-ID header", "content": {"text/event-stream": {}}}
        paths.setdefault(path, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "CodeSDK supervisor API", "version": version},
        "paths": paths,
        "components": {"schemas": schemas,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
    }


def _error_ref() -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
