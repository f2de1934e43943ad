"""The OpenAPI document: valid OpenAPI 3.1, complete enough for a generated client, and true of every answer the
service gives (each real answer is checked against the schema the document declares for its status)."""

from __future__ import annotations

import importlib
import json
import re
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
import trio
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate

from codesdk.protocol import api as models
from codesdk.supervisor.api.openapi import ENDPOINTS, Endpoint

from tests.api.conftest import Api
from tests.waits import HANG_GUARD_S

_TEMPLATE = re.compile(r"\{[^/]+\}")


def _endpoint_of(method: str, path: str) -> Endpoint:
    for endpoint in ENDPOINTS:
        pattern = "^" + _TEMPLATE.sub("[^/]+", re.escape(endpoint.path).replace(r"\{", "{").replace(r"\}", "}")) + "$"
        if endpoint.method == method and re.match(pattern, path):
            return endpoint
    raise AssertionError(f"{method} {path}: no endpoint declares it")


async def _document(api: Api) -> dict[str, Any]:
    r = await api.client.get("/v1/openapi.json")  # no token: the description is public
    assert r.status_code == 200, r.text
    return dict(r.json())


async def test_the_document_is_valid_openapi_3_1_with_an_operation_id_for_every_route(api: Api) -> None:
    with trio.fail_after(60):
        doc = await _document(api)
    validate(doc)  # openapi-spec-validator: the refs resolve, every operation is well-formed
    operations = [(method.upper(), path, op) for path, ops in doc["paths"].items() for method, op in ops.items()]
    assert sorted((m, p) for m, p, _ in operations) == sorted((e.method, e.path) for e in ENDPOINTS)
    ids = [op["operationId"] for _, _, op in operations]
    assert len(set(ids)) == len(ids) == len(ENDPOINTS)
    start = doc["paths"]["/v1/sessions/{session_id}/tasks"]["post"]
    assert start["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/StartTaskRequest"}
    assert start["responses"]["202"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Task"}
    assert {"404", "409", "422", "429"} <= set(start["responses"])
    events = doc["paths"]["/v1/sessions/{session_id}/events"]["get"]
    assert {p["name"]: p["in"] for p in events["parameters"]} == {"session_id": "path", "after_seq": "query",
                                                                  "limit": "query"}
    error = doc["components"]["schemas"]["ErrorInfo"]
    assert {"code", "message", "details"} <= set(error["properties"])
    assert doc["paths"]["/healthz"]["get"]["security"] == []


async def test_the_reference_page_is_served_without_a_token_and_names_every_operation(api: Api) -> None:
    with trio.fail_after(60):
        r = await api.client.get("/v1/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    for elsewhere in ("<script", "<link", "src=", "http://", "https://"):  # nothing fetched, from here or elsewhere
        assert elsewhere not in r.text, elsewhere
    for endpoint in ENDPOINTS:
        assert f"id=op-{endpoint.operation_id}>" in r.text
    assert "id=schema-StartTaskRequest>" in r.text


async def test_a_generated_client_has_every_operation_and_drives_a_task(api: Api, tmp_path: Path) -> None:
    """openapi-python-client, a generator apps use, makes a client of the document in which every operation exists;
    that client then starts a task and reads it back through its own generated models."""
    with trio.fail_after(120):
        doc = await _document(api)
        (tmp_path / "openapi.json").write_text(json.dumps(doc))
        (tmp_path / "config.json").write_text(json.dumps({
            "post_hooks": [],  # no formatter run: what is generated is what is tested
            "content_type_overrides": {"application/gzip": "application/octet-stream"}}))
        package = f"codesdk_generated_{uuid.uuid4().hex[:8]}"
        generator = Path(sys.executable).parent / "openapi-python-client"
        result = await trio.run_process(
            [str(generator), "generate", "--path", str(tmp_path / "openapi.json"), "--meta", "none",
             "--output-path", str(tmp_path / package), "--config", str(tmp_path / "config.json")],
            capture_stdout=True, capture_stderr=True, check=False)
        output = (result.stdout + result.stderr).decode()
        assert result.returncode == 0, output
        generated = {path.stem for path in (tmp_path / package / "api").rglob("*.py") if path.stem != "__init__"}
        wanted = {re.sub(r"(?<!^)(?=[A-Z])", "_", e.operation_id).lower() for e in ENDPOINTS}
        assert wanted <= generated, (wanted - generated, output)

        sys.path.insert(0, str(tmp_path))
        try:
            client_module = importlib.import_module(f"{package}.client")
            sessions = importlib.import_module(f"{package}.api.sessions")
            tasks = importlib.import_module(f"{package}.api.tasks")
            generated_models = importlib.import_module(f"{package}.models")
        finally:
            sys.path.remove(str(tmp_path))
        client = client_module.AuthenticatedClient(base_url="http://codesdk", token=api.alice)
        client.set_async_httpx_client(httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(api.socket)), base_url="http://codesdk",
            headers={"Authorization": f"Bearer {api.alice}"}))
        async with client:
            create: Callable[..., Any] = importlib.import_module(f"{sessions.__name__}.create_session").asyncio
            session = await create(client=client, body=generated_models.CreateSessionRequest(namespace="user:alice"))
            assert isinstance(session, generated_models.Session), session
            start: Callable[..., Any] = importlib.import_module(f"{tasks.__name__}.start_task").asyncio
            body = generated_models.StartTaskRequest.from_dict({"prompt": "hi", "runtime_config": {"scenario": "echo"}})
            task = await start(session.session_id, client=client, body=body)
            assert isinstance(task, generated_models.Task) and task.session_id == session.session_id
            busy = await start(session.session_id, client=client, body=body)  # 409 session_busy, or ended by now
            assert isinstance(busy, generated_models.ErrorAnswer | generated_models.Task), busy
            read: Callable[..., Any] = importlib.import_module(f"{tasks.__name__}.get_task").asyncio
            while (got := await read(task.task_id, client=client)).state.value in ("pending", "running"):
                await trio.sleep(0.05)
            assert got.state.value == "completed"
            missing = await read("nope", client=client)
            assert isinstance(missing, generated_models.ErrorAnswer) and missing.error.code == "task_not_found"


class _Checked:
    """Every answer the test's client receives, checked against what the document declares for its operation and
    status; which operations answered with success."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.succeeded: set[str] = set()
        self.errors: set[tuple[str, int]] = set()

    def check(self, ref: dict[str, Any], value: object, what: str) -> None:
        errors = list(OAS31Validator({**ref, "components": self.doc["components"]}).iter_errors(value))
        assert not errors, (what, [(error.json_path, error.message[:300]) for error in errors])

    async def __call__(self, response: httpx2.Response) -> None:
        await response.aread()
        request = response.request
        endpoint = _endpoint_of(request.method, request.url.path)
        operation = self.doc["paths"][endpoint.path][endpoint.method.lower()]
        status = str(response.status_code)
        assert status in operation["responses"], (endpoint.operation_id, status, response.text)
        media = response.headers.get("content-type", "").split(";")[0]
        content = operation["responses"][status].get("content", {})
        if not content:  # an answer without a body (304)
            assert response.content == b"", (endpoint.operation_id, status)
            if response.status_code == 204:  # a success without a body (a deletion)
                self.succeeded.add(endpoint.operation_id)
            return
        if "application/octet-stream" in content and response.status_code < 400:  # any bytes (a blob's own type)
            media = "application/octet-stream"
        assert media in content, (endpoint.operation_id, status, media)
        if media != "application/json":
            self.succeeded.add(endpoint.operation_id)
            return
        body = response.json()
        self.check(content[media]["schema"], body, f"{endpoint.operation_id} {status}")
        if response.status_code >= 400:
            self.errors.add((endpoint.operation_id, response.status_code))
            return
        self.succeeded.add(endpoint.operation_id)
        if endpoint.answer is not None:  # and the model reads it back to the same JSON: no field it does not know
            again = endpoint.answer.model_validate(body).model_dump(mode="json", exclude_none=True)
            assert again == body, endpoint.operation_id


async def test_every_answer_of_every_operation_matches_the_schema_the_document_declares(api: Api) -> None:
    with trio.fail_after(HANG_GUARD_S * 3):
        checked = _Checked(await _document(api))
        api.client.event_hooks = {"response": [checked]}
        alice, admin, c = api.auth(api.alice), api.auth(api.admin), api.client
        assert (await c.get("/healthz")).status_code == 200
        assert (await c.get("/readyz")).status_code == 200
        assert (await c.get("/metrics", headers=admin)).status_code == 200
        assert (await c.get("/metrics", headers=alice)).status_code == 403
        assert (await c.get("/v1/docs")).status_code == 200
        assert (await c.get("/v1/openapi.json")).status_code == 200
        assert (await c.get("/v1/sessions", headers={"Authorization": "Bearer wrong"})).status_code == 401
        session = (await c.post("/v1/sessions", headers=alice, json={"namespace": "user:alice"})).json()
        sid = session["session_id"]
        assert (await c.post("/v1/sessions", headers=alice, json={"namespace": "user:bob"})).status_code == 403
        assert (await c.post("/v1/sessions", headers=alice, content=b"{")).status_code in (400, 422)
        assert (await c.get("/v1/sessions?limit=0", headers=alice)).status_code == 422
        assert (await c.get("/v1/sessions", headers=alice)).status_code == 200
        assert (await c.get(f"/v1/sessions/{sid}", headers=alice)).status_code == 200
        assert (await c.get("/v1/sessions/nope", headers=alice)).status_code == 404

        task = (await c.post(f"/v1/sessions/{sid}/tasks", headers=alice, json={
            "prompt": "write", "interaction_mode": "interactive",
            "runtime_config": {"scenario": "write-or-deny"}})).json()
        busy = await c.post(f"/v1/sessions/{sid}/tasks", headers=alice, json={"prompt": "again"})
        assert busy.status_code == 409
        while not (pending := (await c.get("/v1/approvals", headers=alice)).json()["approvals"]):
            await trio.sleep(0.05)
        assert (await c.get("/v1/approvals?state=nope", headers=alice)).status_code == 422
        decide = f"/v1/approvals/{pending[0]['approval_id']}"
        assert (await c.post(decide, headers=alice, json={"allow": "yes"})).status_code == 422
        assert (await c.post(decide, headers=alice, json={"allow": True, "scope": "session"})).status_code == 200
        assert (await c.post(decide, headers=alice, json={"allow": True})).status_code == 409
        batch = await c.post("/v1/approvals/decisions", headers=alice,
                             json={"decisions": [{"approval_id": pending[0]["approval_id"], "allow": True}]})
        assert batch.status_code == 200 and batch.json()["results"][0]["status"] == 409
        async with c.stream("GET", f"/v1/sessions/{sid}/events/stream?until_terminal=true", headers=alice) as stream:
            async for line in stream.aiter_lines():
                if line.startswith("data: "):
                    checked.check({"$ref": "#/components/schemas/NormalizedEvent"}, json.loads(line[6:]), line)
        assert (await c.get(f"/v1/tasks/{task['task_id']}", headers=alice)).json()["state"] == "completed"
        page = (await c.get(f"/v1/sessions/{sid}/events?limit=3", headers=alice)).json()
        assert page["has_more"] and len(page["events"]) == 3
        assert (await c.get(f"/v1/sessions/{sid}/events", headers=alice)).status_code == 200
        assert (await c.get(f"/v1/sessions/{sid}/transcript", headers=alice)).status_code == 200
        [grant] = (await c.get(f"/v1/sessions/{sid}/grants", headers=alice)).json()["grants"]
        revoke = f"/v1/sessions/{sid}/grants/{grant['grant_id']}"
        assert (await c.delete(revoke, headers=alice)).status_code == 200
        assert (await c.delete(revoke, headers=alice)).status_code == 409
        # built at the lowest CPU priority (SCHED_IDLE): on a busy machine it waits for idle time, however long
        assert (await c.get(f"/v1/sessions/{sid}/bundle", headers=alice, timeout=None)).status_code == 200
        [compiled] = [e["payload"]["input_ref"] for e in page["events"] if e["type"] == "model.input"]
        blob = f"/v1/sessions/{sid}/blobs/{compiled}"
        assert (await c.get(blob, headers=alice)).status_code == 200
        assert (await c.get(blob, headers={**alice, "Range": "bytes=0-1"})).status_code == 206
        assert (await c.get(blob, headers={**alice, "Range": "bytes=99999999-"})).status_code == 416
        etag = (await c.get(blob, headers=alice)).headers["etag"]
        assert (await c.get(blob, headers={**alice, "If-None-Match": etag})).status_code == 304
        assert (await c.get(f"/v1/sessions/{sid}/blobs/nope", headers=alice)).status_code == 404
        assert (await c.post(f"/v1/tasks/{task['task_id']}/stop", headers=alice, json={})).status_code == 409

        asking = (await c.post(f"/v1/sessions/{sid}/tasks", headers=alice, json={
            "prompt": "ask", "interaction_mode": "interactive", "runtime_config": {"scenario": "ask-user"}})).json()
        while not (asked := (await c.get("/v1/questions", headers=alice)).json()["questions"]):
            await trio.sleep(0.05)
        assert (await c.get("/v1/questions?state=nope", headers=alice)).status_code == 422
        question = f"/v1/questions/{asked[0]['question_id']}"
        assert (await c.get(question, headers=alice)).status_code == 200
        assert (await c.post(question, headers=alice, json={"answers": {"colour": "green"}})).status_code == 422
        assert (await c.post(question, headers=alice, json={"decline": True})).status_code == 200
        assert (await c.post(question, headers=alice, json={"decline": True})).status_code == 409
        while (await c.get(f"/v1/tasks/{asking['task_id']}", headers=alice)).json()["state"] == "running":
            await trio.sleep(0.05)

        hung = (await c.post(f"/v1/sessions/{sid}/tasks", headers=alice, json={
            "prompt": "wait", "runtime_config": {"scenario": "hang"}})).json()
        steer = f"/v1/tasks/{hung['task_id']}/input"
        assert (await c.post(steer, headers=alice, json={"input": "also this"})).status_code == 202
        assert (await c.post(steer, headers=alice, json={"input": ""})).status_code == 422
        stopped = await c.post(f"/v1/tasks/{hung['task_id']}/stop", headers=alice, json={"reason": "enough"})
        assert stopped.status_code == 200 and stopped.json()["state"] == "stopped"

        assert (await c.get("/v1/runtimes", headers=alice)).status_code == 200
        assert (await c.get("/v1/runtimes?namespace=user:bob", headers=alice)).status_code == 404
        assert (await c.get("/v1/me", headers=alice)).json() == {"name": "alice", "admin": False,
                                                                 "namespaces": ["user:alice"]}
        assert (await c.get("/v1/namespaces", headers=alice)).status_code == 200
        assert (await c.get("/v1/namespaces?x=1", headers=alice)).status_code == 422
        assert (await c.get("/v1/namespaces/user:alice/auth/claude", headers=alice)).status_code == 200
        assert (await c.get("/v1/namespaces/user:alice/runtime-env", headers=alice)).status_code == 200
        assert (await c.get(f"/v1/namespaces/user:alice/runtime-env?session_id={sid}", headers=alice)).status_code == 200
        assert (await c.get("/v1/namespaces/user:bob/runtime-env", headers=alice)).status_code == 404
        assert (await c.get("/v1/workers", headers=admin)).status_code == 200
        assert (await c.get("/v1/workers", headers=alice)).status_code == 403
        assert (await c.delete("/v1/namespaces/user:alice/quarantine", headers=admin)).status_code == 200
        assert (await c.patch("/v1/namespaces/user:alice/env", headers=admin,
                              json={"set": {"GREETING": "hi"}})).status_code == 200
        assert (await c.patch("/v1/namespaces/user:alice/env", headers=admin,
                              json={"set": {"bad name": "x"}})).status_code == 422
        assert (await c.get("/v1/namespaces/user:alice/env", headers=admin)).status_code == 200
        egress = "/v1/namespaces/user:alice/egress"
        assert (await c.put(egress, headers=admin, json={"hosts": []})).status_code == 200
        assert (await c.put(egress, headers=admin, json={"hosts": ["wider.example.com"]})).status_code == 422
        assert (await c.get(egress, headers=admin)).status_code == 200
        budget = "/v1/namespaces/user:alice/budget"
        assert (await c.put(budget, headers=admin, json={"monthly_usd": 100})).status_code == 200
        assert (await c.put(budget, headers=admin, json={"monthly_usd": "lots"})).status_code == 422
        assert (await c.get(budget, headers=admin)).status_code == 200
        tokens = await c.post("/v1/tokens", headers=admin, json={"name": "carol", "namespaces": ["user:carol"]})
        assert tokens.status_code == 201
        carol = tokens.json()["token"]["id"]
        assert (await c.post("/v1/tokens", headers=admin, json={"name": "carol"})).status_code == 422
        assert (await c.get("/v1/tokens", headers=admin)).status_code == 200
        assert (await c.post(f"/v1/tokens/{carol}/rotate", headers=admin)).status_code == 200
        assert (await c.delete(f"/v1/tokens/{carol}", headers=admin)).status_code == 200
        assert (await c.delete(f"/v1/tokens/{carol}", headers=admin)).status_code == 404

        hooks = "/v1/webhooks"
        assert (await c.post(hooks, headers=alice, json={"url": "http://example.com/", "kinds": ["*"]})
                ).status_code == 422
        hook = (await c.post(hooks, headers=alice, json={"url": "http://127.0.0.1:9/", "kinds": ["task.failed"]})
                ).json()["webhook"]
        assert (await c.get(hooks, headers=alice)).status_code == 200
        assert (await c.get(f"{hooks}/{hook['id']}", headers=alice)).status_code == 200
        assert (await c.get(f"{hooks}/{hook['id']}", headers=api.auth(api.bob))).status_code == 404
        assert (await c.post(f"{hooks}/{hook['id']}/rotate", headers=alice)).status_code == 200
        sent = (await c.post(f"{hooks}/{hook['id']}/test", headers=alice)).json()["delivery"]
        assert (await c.get(f"{hooks}/{hook['id']}/deliveries?state=nope", headers=alice)).status_code == 422
        assert (await c.get(f"{hooks}/{hook['id']}/deliveries", headers=alice)).status_code == 200
        assert (await c.get(f"{hooks}/{hook['id']}/deliveries/{sent['id']}", headers=alice)).status_code == 200
        assert (await c.post(f"{hooks}/{hook['id']}/deliveries/{sent['id']}/redeliver", headers=alice)
                ).status_code == 202
        assert (await c.delete(f"{hooks}/{hook['id']}", headers=alice)).status_code == 204

        capped = (await c.post("/v1/sessions", headers=alice, json={"namespace": "user:alice",
                                                                    "budget": {"tokens": 1}})).json()["session_id"]
        over = (await c.post(f"/v1/sessions/{capped}/tasks", headers=alice, json={"prompt": "hi"})).json()
        assert (await api.ended(api.alice, over["task_id"]))["state"] == "stopped"
        assert (await c.get(f"/v1/sessions/{capped}/budget", headers=alice)).json()["raise_pending"]
        assert (await c.post(f"/v1/sessions/{capped}/tasks", headers=alice, json={"prompt": "x"})).status_code == 409
        assert (await c.put(f"/v1/sessions/{capped}/budget", headers=alice,
                            json={"limits": {"tokens": 2}})).status_code == 200
        raised = await c.post(f"/v1/sessions/{capped}/budget/raise", headers=alice,
                              json={"limits": {"tokens": 10_000}, "continue": True})
        assert raised.status_code == 200 and raised.json()["task"] is not None
        assert (await api.ended(api.alice, raised.json()["task"]["task_id"]))["state"] == "completed"

        archived = await c.patch(f"/v1/sessions/{sid}", headers=alice, json={"archived": True, "title": "Done"})
        assert archived.status_code == 200 and archived.json()["state"] == "archived"
        assert (await c.get("/v1/sessions?state=archived&q=done", headers=alice)).json()["sessions"]
        assert (await c.post(f"/v1/sessions/{sid}/fork", headers=alice, json={"at_seq": 3})).status_code == 422
        fork = await c.post(f"/v1/sessions/{sid}/fork", headers=alice, json={})
        assert fork.status_code == 201
        assert (await c.delete(f"/v1/sessions/{sid}", headers=alice)).status_code == 200
        assert (await c.delete(f"/v1/sessions/{sid}", headers=alice)).status_code == 404
        assert (await c.delete(f"/v1/sessions/{fork.json()['session_id']}", headers=alice)).status_code == 200

    assert checked.succeeded == {e.operation_id for e in ENDPOINTS}, \
        {e.operation_id for e in ENDPOINTS} - checked.succeeded
    assert len(checked.errors) >= 15, checked.errors


@pytest.mark.parametrize("model", [models.CreateSessionRequest, models.StartTaskRequest, models.DecisionRequest])
def test_request_models_refuse_unknown_fields_and_loose_types(model: type[models.Request]) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        model.model_validate({"surprise": 1})
    if model is models.DecisionRequest:
        with pytest.raises(ValidationError):
            model.model_validate({"allow": "yes"})


def test_answers_ignore_fields_a_newer_service_added() -> None:
    info = models.ErrorInfo.model_validate({"code": "x", "message": "y", "added_later": [1]})
    assert info.model_dump(exclude_none=True) == {"code": "x", "message": "y"}


def test_the_api_doc_lists_every_operation() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    missing = [e.operation_id for e in ENDPOINTS if f"| `{e.method} {e.path}` | `{e.operation_id}` |" not in doc]
    assert not missing, f"docs/api.md does not list {missing}"
