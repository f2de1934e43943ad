"""The API's OpenAPI 3.1 document and its web page, both generated from the route table (``ENDPOINTS``) and the
typed API models (``codesdk.protocol.api``): what is served is what is described. No HTTP stack is imported here
(``codesdk-supervisor openapi`` prints the document without a service)."""

from __future__ import annotations

import html
import json
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from codesdk.protocol import NormalizedEvent, api

from ._endpoints import ENDPOINTS, STATUS_MEANS, Access, Endpoint

__all__ = ["ENDPOINTS", "Access", "Endpoint", "openapi_document", "reference_page"]

_REF = "#/components/schemas/{model}"
#: Answers are described as they validate, not as they serialize: an event's ``type`` is serialized through a plain
#: ``str`` (fast), which would lose the ``const`` that tells one event's schema from another's in the union.
_MODE: JsonSchemaMode = "validation"
_TAGS = {
    "sessions": "A conversation with one runtime in one namespace: its events, transcript and support bundle.",
    "tasks": "One prompt and everything the runtime did for it, to its one terminal event.",
    "events": "The session's normalized events, stored with a gap-free seq: paged, or live over SSE.",
    "approvals": "Tool calls the policy left to a person (interactive tasks).",
    "questions": "Questions a runtime asks its user (interactive tasks), answered once.",
    "runtimes": "What a namespace's worker can run, and its logins.",
    "namespaces": "Tenants' namespaces and, for the operator, their variables and quarantine.",
    "service": "Health, readiness, metrics, workers and this description.",
    "tokens": "API tokens, for the operator: made, listed, rotated and revoked (the tokens file the CLI edits too).",
    "webhooks": "Endpoints sent signed deliveries of what happens (tasks ended, approvals waiting...), retried.",
}


def openapi_document(version: str, endpoints: tuple[Endpoint, ...] = ENDPOINTS) -> dict[str, Any]:
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [(api.ErrorAnswer, _MODE), (NormalizedEvent, _MODE)]
    for endpoint in endpoints:
        if endpoint.body is not None:
            models.append((endpoint.body, _MODE))
        if endpoint.answer is not None:
            models.append((endpoint.answer, _MODE))
    refs, defs = models_json_schema(models, ref_template=_REF)
    schemas = defs.get("$defs", {})
    event = refs.pop((NormalizedEvent, _MODE))  # a tagged union, inline where used: named for the stream
    schemas["NormalizedEvent"] = {"description": "One stored event: its `type` says which payload it carries.",
                                  **event}
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = _operation(endpoint, refs)
    return {
        "openapi": "3.1.0",
        "info": {"title": "CodeSDK supervisor API", "version": version,
                 "description": "Sessions, tasks and their normalized events over coding-agent runtimes. Every "
                                "error answer is an `ErrorAnswer`: branch on `error.code`."},
        "tags": [{"name": name, "description": text} for name, text in _TAGS.items()],
        "paths": paths,
        "components": {"schemas": dict(sorted(schemas.items())),
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                                      "description": "A tenant's token or the admin's"}}},
        "security": [{"bearer": []}],
    }


def _operation(endpoint: Endpoint, refs: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    operation: dict[str, Any] = {"operationId": endpoint.operation_id, "summary": endpoint.summary,
                                 "tags": [endpoint.tag]}
    access = {Access.PUBLIC: "No token needed.", Access.ADMIN: "The admin token only.", Access.TOKEN: "",
              Access.METRICS: "The admin token or a metrics token."}
    description = " ".join(part for part in (endpoint.description, access[endpoint.access]) if part)
    if description:
        operation["description"] = description
    if endpoint.access is Access.PUBLIC:
        operation["security"] = []
    parameters = [{"name": name.strip("{}"), "in": "path", "required": True, "schema": {"type": "string"}}
                  for name in endpoint.path.split("/") if name.startswith("{")]
    if endpoint.query is not None:
        parameters += _query_parameters(endpoint.query)
    if endpoint.media_type == "text/event-stream":
        parameters.append({"name": "Last-Event-ID", "in": "header", "required": False, "schema": {"type": "string"},
                           "description": "Resume after this seq (what the last event's `id` said)."})
    parameters += [{"name": name, "in": "header", "required": False, "schema": {"type": "string"},
                    "description": what} for name, what in endpoint.headers]
    if endpoint.method == "POST":
        parameters.append({"name": "Idempotency-Key", "in": "header", "required": False,
                           "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"},
                           "description": "Retry safely: the same request with the same key within 24 h gets the "
                                          "first one's answer (header `Idempotent-Replayed: true`) without running "
                                          "again; another request with the key is 409 `idempotency_key_reused`."})
    if parameters:
        operation["parameters"] = parameters
    if endpoint.body is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": refs[(endpoint.body, _MODE)]}}}
    success = _success(endpoint, refs)
    also = {str(status): {"description": what, **({"content": success["content"]} if status == 206 else {})}
            for status, what in endpoint.also}
    operation["responses"] = {str(endpoint.status): success} | also | {
        str(status): {"description": STATUS_MEANS[status],
                      "content": {"application/json": {"schema": refs[(api.ErrorAnswer, _MODE)]}}}
        for status in endpoint.error_statuses()}
    return operation


def _success(endpoint: Endpoint, refs: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    if endpoint.status == 204:
        return {"description": "done; no body"}
    if endpoint.answer is not None:
        return {"description": endpoint.answer.__doc__.splitlines()[0] if endpoint.answer.__doc__ else "success",
                "content": {"application/json": {"schema": refs[(endpoint.answer, _MODE)]}}}
    if endpoint.media_type == "text/event-stream":
        return {"description": f"The event stream; each `data` is a {_link('NormalizedEvent')}.",
                "content": {"text/event-stream": {"schema": {"type": "string"}}}}
    if endpoint.media_type == "application/json":
        return {"description": "success", "content": {"application/json": {"schema": {"type": "object"}}}}
    schema: dict[str, Any] = {"type": "string"}
    if not endpoint.media_type.startswith("text/"):
        schema["contentMediaType"] = endpoint.media_type
    return {"description": "success", "content": {endpoint.media_type: {"schema": schema}}}


def _link(schema: str) -> str:
    return f"[{schema}](#/components/schemas/{schema})"


def _query_parameters(query: type[api.Query]) -> list[dict[str, Any]]:
    schema = query.model_json_schema(mode=_MODE)
    defs = schema.get("$defs", {})
    required = set(schema.get("required", ()))
    parameters = []
    for name, prop in schema.get("properties", {}).items():
        prop = dict(prop)
        if "$ref" in prop:  # an enum: inline, as a query parameter's schema is read on its own
            prop = {**{k: v for k, v in defs[prop.pop("$ref").rsplit("/", 1)[-1]].items() if k != "title"}, **prop}
        description = prop.pop("description", None)
        prop.pop("title", None)
        parameter: dict[str, Any] = {"name": name, "in": "query", "required": name in required, "schema": prop}
        if description:
            parameter["description"] = description
        parameters.append(parameter)
    return parameters


# -- the web page -------------------------------------------------------------------------------------

def reference_page(document: dict[str, Any]) -> str:
    """The document as one self-contained HTML page (no script, nothing fetched): each operation with its
    parameters, body and answers, then each schema's fields."""
    e = html.escape
    out = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{e(document['info']['title'])}</title>",
           f"<style>{_STYLE}</style></head><body>",
           f"<h1>{e(document['info']['title'])} <small>{e(document['info']['version'])}</small></h1>",
           f"<p>{e(document['info'].get('description', ''))} The machine-readable form: "
           "<a href=/v1/openapi.json>/v1/openapi.json</a>.</p>"]
    for tag in document["tags"]:
        out.append(f"<h2 id=tag-{e(tag['name'])}>{e(tag['name'])}</h2><p>{e(tag['description'])}</p>")
        for path, methods in document["paths"].items():
            for method, op in methods.items():
                if tag["name"] in op["tags"]:
                    out.append(_operation_html(method, path, op))
    out.append("<h2 id=schemas>Schemas</h2>")
    for name, schema in sorted(document["components"]["schemas"].items()):
        out.append(_schema_html(name, schema))
    out.append("</body></html>")
    return "\n".join(out)


def _operation_html(method: str, path: str, op: dict[str, Any]) -> str:
    e = html.escape
    parts = [f"<section id=op-{e(op['operationId'])}><h3><code>{e(method.upper())} {e(path)}</code> "
             f"<small>{e(op['operationId'])}</small></h3><p>{e(op['summary'])}.</p>"]
    if "description" in op:
        parts.append(f"<p>{e(op['description'])}</p>")
    if op.get("parameters"):
        rows = "".join(f"<tr><td><code>{e(p['name'])}</code></td><td>{e(p['in'])}</td>"
                       f"<td>{_type_html(p['schema'])}</td><td>{'yes' if p['required'] else ''}</td>"
                       f"<td>{e(p.get('description', ''))}</td></tr>" for p in op["parameters"])
        parts.append(f"<table><tr><th>parameter<th>in<th>type<th>required<th></tr>{rows}</table>")
    if "requestBody" in op:
        parts.append(f"<p>Body: {_type_html(op['requestBody']['content']['application/json']['schema'])}</p>")
    rows = ""
    for status, answer in op["responses"].items():
        content = answer.get("content", {})
        kinds = ", ".join(f"{e(media)} {_type_html(c.get('schema', {}))}" for media, c in content.items())
        rows += f"<tr><td>{e(status)}</td><td>{kinds}</td><td>{e(answer['description'])}</td></tr>"
    parts.append(f"<table><tr><th>status<th>body<th></tr>{rows}</table></section>")
    return "".join(parts)


def _schema_html(name: str, schema: dict[str, Any]) -> str:
    e = html.escape
    parts = [f"<section id=schema-{e(name)}><h3>{e(name)}</h3>"]
    if schema.get("description"):
        parts.append(f"<p>{e(schema['description'])}</p>")
    if "enum" in schema:
        parts.append("<p>One of " + ", ".join(f"<code>{e(json.dumps(v))}</code>" for v in schema["enum"]) + "</p>")
    properties = schema.get("properties", {})
    if properties:
        required = set(schema.get("required", ()))
        rows = "".join(f"<tr><td><code>{e(field)}</code></td><td>{_type_html(prop)}</td>"
                       f"<td>{'yes' if field in required else ''}</td><td>{e(prop.get('description', ''))}</td></tr>"
                       for field, prop in properties.items())
        parts.append(f"<table><tr><th>field<th>type<th>required<th></tr>{rows}</table>")
    elif "enum" not in schema:
        parts.append(f"<p>{_type_html(schema)}</p>")
    return "".join(parts) + "</section>"


def _type_html(schema: dict[str, Any]) -> str:
    """A schema's type in a few words, each referenced schema a link."""
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        return f"<a href=#schema-{html.escape(name)}>{html.escape(name)}</a>"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " | ".join(_type_html(s) for s in schema[key])
    kind = schema.get("type")
    if kind == "array":
        return f"array of {_type_html(schema.get('items', {}))}"
    if "const" in schema:
        return f"<code>{html.escape(json.dumps(schema['const']))}</code>"
    if "enum" in schema:
        return " | ".join(f"<code>{html.escape(json.dumps(v))}</code>" for v in schema["enum"])
    return html.escape(str(kind)) if kind else "any"


_STYLE = ("body{font:15px/1.45 system-ui,sans-serif;max-width:72em;margin:2em auto;padding:0 1em;color:#222}"
          "code{font:13px ui-monospace,monospace}table{border-collapse:collapse;margin:.5em 0}"
          "td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left;vertical-align:top}"
          "section{border-top:1px solid #eee;padding-top:.3em}small{color:#777;font-weight:normal}")
