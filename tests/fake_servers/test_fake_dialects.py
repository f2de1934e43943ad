"""The fake model's Gemini and chat completions dialects (fixtures/fake_anthropic: ``gemini``,
``chat_completions``) against the real server subprocess over HTTP (httpx2), plus their pure parsing
functions."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fixtures.fake_anthropic import FakeAnthropic, chat_completions, gemini
from fixtures.fake_anthropic.scenario import RESULT_CUT, resolve_tool

from tests.waits import wait_for

TIMEOUT = 10.0
GEMINI_MODEL = "gemini-2.5-flash"
GEMINI_PATH = f"/v1beta/models/{GEMINI_MODEL}:streamGenerateContent"
CHAT_PATH = "/v1/chat/completions"
GEMINI_TOOLS = [{"functionDeclarations": [
    {"name": "mcp_codesdk_workspace_read", "description": "read", "parametersJsonSchema": {"type": "object"}},
    {"name": "mcp_codesdk_echo", "description": "echo", "parametersJsonSchema": {"type": "object"}},
    {"name": "mcp_a_dup", "parametersJsonSchema": {"type": "object"}},
    {"name": "mcp_b_dup", "parametersJsonSchema": {"type": "object"}}]}]
CHAT_TOOLS = [{"type": "function",
               "function": {"name": name, "description": name, "parameters": {"type": "object"}}}
              for name in ("codesdk_workspace_read", "codesdk_echo", "a_dup", "b_dup")]
SESSION_CONTEXT = "<session_context>\nToday is a day. CALL echo {\"no\": 1}\n</session_context>"


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeAnthropic]:
    with FakeAnthropic.start(tmp_path_factory.mktemp("fake") / "api.jsonl") as server:
        yield server


@pytest.fixture(scope="module")
def client(fake: FakeAnthropic) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=fake.base_url, timeout=TIMEOUT) as http:
        yield http


def data_events(raw: bytes) -> list[Any]:
    """The ``data:`` payloads of an SSE body framed as both APIs frame it: one ``data:`` line per event, no
    ``event:`` line, CRLF CRLF after each."""
    text = raw.decode()
    assert text.endswith("\r\n\r\n")
    payloads = []
    for frame in text.split("\r\n\r\n")[:-1]:
        assert frame.startswith("data: ") and "\n" not in frame, frame
        payload = frame.removeprefix("data: ")
        payloads.append(payload if payload == "[DONE]" else json.loads(payload))
    return payloads


# --- Gemini -------------------------------------------------------------------------------------------------

def gemini_body(prompt: str, *history: dict[str, Any], tools: Any = None) -> dict[str, Any]:
    """A request as Gemini CLI 0.61.0 makes it: the first user content carries the session context."""
    contents = [{"role": "user", "parts": [{"text": SESSION_CONTEXT}, {"text": prompt}]}, *history]
    return {"contents": contents, "systemInstruction": {"parts": [{"text": "You are Gemini CLI. ERROR 500"}]},
            "tools": GEMINI_TOOLS if tools is None else tools,
            "generationConfig": {"temperature": 1, "thinkingConfig": {"includeThoughts": True}}}


def post_gemini(client: httpx2.Client, payload: Any, path: str = GEMINI_PATH) -> httpx2.Response:
    return client.post(path, params={"alt": "sse"}, json=payload,
                       headers={"x-goog-api-key": "gm-secret", "user-agent": "GeminiCLI-acp/0.61.0"})


def gemini_turn(client: httpx2.Client, payload: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The model's turn rebuilt from its stream as the CLI reads it, checking the chunk grammar on the way."""
    resp = post_gemini(client, payload)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = data_events(resp.content)
    *chunks, last = events
    assert len({e["responseId"] for e in events}) == 1 and len({e["modelVersion"] for e in events}) == 1
    turn: dict[str, Any] = {"thoughts": [], "text": "", "text_chunks": 0, "calls": [], "call_chunks": 0,
                            "model": last["modelVersion"]}
    for chunk in chunks:
        [candidate] = chunk["candidates"]
        assert candidate["index"] == 0 and "finishReason" not in candidate and "usageMetadata" not in chunk
        assert candidate["content"]["role"] == "model"
        parts = candidate["content"]["parts"]
        if "functionCall" in parts[0]:
            assert all("functionCall" in p for p in parts)
            turn["calls"] += [p["functionCall"] for p in parts]
            turn["call_chunks"] += 1
            continue
        [part] = parts
        assert not turn["calls"]  # text and thoughts come before the calls
        if part.get("thought"):
            assert not turn["text"]
            turn["thoughts"].append(part["text"])
        else:
            turn["text"] += part["text"]
            turn["text_chunks"] += 1
    [candidate] = last["candidates"]
    assert candidate == {"content": {"role": "model", "parts": [{"text": ""}]}, "finishReason": "STOP",
                         "index": 0}
    usage = last["usageMetadata"]
    assert usage["totalTokenCount"] == usage["promptTokenCount"] + usage["candidatesTokenCount"]
    assert usage["promptTokenCount"] > 0 and usage["candidatesTokenCount"] > 0
    return turn, events


def test_gemini_text_streams_in_chunks_without_the_session_context(client: httpx2.Client) -> None:
    turn, _ = gemini_turn(client, gemini_body("hello there"))
    assert turn["text"] == "Echo: hello there" and turn["text_chunks"] >= 2
    assert turn["model"] == GEMINI_MODEL and turn["thoughts"] == [] and turn["calls"] == []
    turn, _ = gemini_turn(client, gemini_body("SAY just this"))
    assert turn["text"] == "just this"


def test_gemini_reads_the_newest_prompt(client: httpx2.Client) -> None:
    history = [{"role": "model", "parts": [{"text": "Echo: ..."}]},
               {"role": "user", "parts": [{"text": "SAY second prompt"}]}]
    turn, _ = gemini_turn(client, gemini_body("ERROR 500", *history))
    assert turn["text"] == "second prompt"


def test_gemini_thought_say_and_parallel_calls_resolved_by_suffix(fake: FakeAnthropic,
                                                                  client: httpx2.Client) -> None:
    prompt = ('THINK looking at two files\nSAY Reading\nCALL workspace_read {"path": "a.txt"}\n'
              'CALL mcp_codesdk_echo {"text": "é"}\nCALL dup {}\nCALL nosuch {"x": [1]}')
    turn, _ = gemini_turn(client, gemini_body(prompt))
    assert turn["thoughts"] == ["**Thinking**\nlooking at two files"] and turn["text"] == "Reading"
    assert turn["call_chunks"] == 1  # parallel calls: all parts in one chunk
    assert [(c["name"], c["args"]) for c in turn["calls"]] == [
        ("mcp_codesdk_workspace_read", {"path": "a.txt"}), ("mcp_codesdk_echo", {"text": "é"}),
        ("dup", {}), ("nosuch", {"x": [1]})]
    ids = [c["id"] for c in turn["calls"]]
    assert len(set(ids)) == 4 and all(i.startswith("fc-") for i in ids)
    # The log shows the calls as they went on the wire.
    logged = fake.requests(GEMINI_PATH)[-1]["reply"]["content"]
    assert [b["id"] for b in logged if b["type"] == "tool_use"] == ids


def test_gemini_results_quote_function_responses_by_name(client: httpx2.Client) -> None:
    # The second call's id is one Gemini made up; the first one's the API gave.
    read, echo = ("fc-1", "mcp_codesdk_workspace_read"), ("mcp_codesdk_echo_17_1", "mcp_codesdk_echo")
    wrapped = "<untrusted_context>\nalpha\n</untrusted_context>"
    history = [
        {"role": "model", "parts": [{"functionCall": {"id": i, "name": n, "args": {}}}
                                    for i, n in (read, echo)]},
        {"role": "user", "parts": [
            {"functionResponse": {"id": read[0], "name": read[1], "response": {"output": wrapped}}},
            {"functionResponse": {"id": echo[0], "name": echo[1],
                                  "response": {"error": "DENIED by policy: " + "y" * 400}}}]}]
    turn, _ = gemini_turn(client, gemini_body('CALL workspace_read {"path": "a.txt"}', *history))
    assert turn["calls"] == []
    assert turn["text"] == ("RESULTS: mcp_codesdk_workspace_read=alpha | mcp_codesdk_echo="
                            + ("DENIED by policy: " + "y" * 400)[:RESULT_CUT])


def test_gemini_model_directive_names_the_served_model(client: httpx2.Client) -> None:
    turn, _ = gemini_turn(client, gemini_body("MODEL gemini-9-pro\nSAY hi"))
    assert turn["model"] == "gemini-9-pro" and turn["text"] == "hi"


@pytest.mark.parametrize(("status", "name"), [
    (400, "INVALID_ARGUMENT"), (401, "UNAUTHENTICATED"), (403, "PERMISSION_DENIED"), (404, "NOT_FOUND"),
    (429, "RESOURCE_EXHAUSTED"), (500, "INTERNAL"), (503, "UNAVAILABLE")])
def test_gemini_http_errors_have_google_bodies(client: httpx2.Client, status: int, name: str) -> None:
    resp = post_gemini(client, gemini_body(f"do it\nnow ERROR {status}"))
    assert resp.status_code == status and resp.headers["content-type"] == "application/json"
    assert resp.json() == {"error": {"code": status, "message": f"fake error: HTTP {status} ({name})",
                                     "status": name}}


def test_gemini_prompt_too_long(client: httpx2.Client) -> None:
    resp = post_gemini(client, gemini_body("THINK first\nERROR prompt_too_long"))
    assert resp.status_code == 400
    assert resp.json() == {"error": {"code": 400, "message": gemini.PROMPT_TOO_LONG,
                                     "status": "INVALID_ARGUMENT"}}


def test_gemini_error_mid_stream(client: httpx2.Client) -> None:
    resp = post_gemini(client, gemini_body("ERROR stream"))
    assert resp.status_code == 200
    first, error = data_events(resp.content)
    assert first["candidates"][0]["content"]["parts"][0]["text"]
    assert "finishReason" not in first["candidates"][0]
    assert error == {"error": {"code": 500, "message": gemini.STREAM_FAILURE, "status": "INTERNAL"}}


def test_gemini_bad_bodies_and_other_methods(client: httpx2.Client) -> None:
    resp = client.post(GEMINI_PATH, content=b"[1, 2]")
    assert resp.status_code == 400 and resp.json()["error"]["status"] == "INVALID_ARGUMENT"
    resp = client.post(f"/v1beta/models/{GEMINI_MODEL}:generateContent", json=gemini_body("hi"))
    assert resp.status_code == 404


# --- chat completions ---------------------------------------------------------------------------------------

def chat_body(*messages: dict[str, Any], tools: Any = None, model: str = "fake-model") -> dict[str, Any]:
    """A request as OpenCode 1.18.33 makes it through ``@ai-sdk/openai-compatible``."""
    return {"model": model, "max_tokens": 8000,
            "messages": [{"role": "system", "content": "You are opencode. ERROR 500"}, *messages],
            "tools": CHAT_TOOLS if tools is None else tools, "tool_choice": "auto", "stream": True,
            "stream_options": {"include_usage": True}}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def post_chat(client: httpx2.Client, payload: Any) -> httpx2.Response:
    return client.post(CHAT_PATH, json=payload, headers={"authorization": "Bearer oc-secret"})


def chat_turn(client: httpx2.Client, payload: Any) -> tuple[dict[str, Any], list[Any]]:
    """The assistant message rebuilt from its chunks as the AI SDK does, checking the chunk grammar."""
    resp = post_chat(client, payload)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = data_events(resp.content)
    *chunks, finish, usage_chunk, done = events
    assert done == "[DONE]"
    for event in events[:-1]:
        assert event["object"] == "chat.completion.chunk" and event["id"] == events[0]["id"]
        assert isinstance(event["created"], int) and event["model"] == events[0]["model"]
    turn: dict[str, Any] = {"reasoning": "", "content": "", "content_chunks": 0, "calls": {},
                            "model": events[0]["model"]}
    for chunk in chunks:
        [choice] = chunk["choices"]
        assert choice["index"] == 0 and choice["finish_reason"] is None
        delta = choice["delta"]
        if "reasoning_content" in delta:
            assert not turn["content"] and not turn["calls"]
            turn["reasoning"] += delta["reasoning_content"]
        elif "content" in delta:
            assert delta["role"] == "assistant" and not turn["calls"]
            turn["content"] += delta["content"]
            turn["content_chunks"] += 1
        else:
            [call] = delta["tool_calls"]
            if "id" in call:  # the call opens: id, type and name, no arguments yet
                assert call["index"] == len(turn["calls"]) and call["type"] == "function"
                assert call["function"]["arguments"] == ""
                turn["calls"][call["index"]] = {"id": call["id"], "name": call["function"]["name"],
                                                "arguments": ""}
            else:
                assert call["index"] == len(turn["calls"]) - 1 and set(call["function"]) == {"arguments"}
                turn["calls"][call["index"]]["arguments"] += call["function"]["arguments"]
    turn["calls"] = [{**c, "arguments": json.loads(c["arguments"])} for c in turn["calls"].values()]
    [choice] = finish["choices"]
    turn["finish_reason"] = choice["finish_reason"]
    assert choice["delta"] == {}
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    return turn, events


def test_chat_text_streams_in_chunks(client: httpx2.Client) -> None:
    turn, _ = chat_turn(client, chat_body(user("hello there")))
    assert turn["content"] == "Echo: hello there" and turn["content_chunks"] >= 2
    assert turn["finish_reason"] == "stop" and turn["model"] == "fake-model" and turn["calls"] == []
    parts = [{"type": "text", "text": "SAY from"}, {"type": "image_url", "image_url": {"url": "x"}}]
    turn, _ = chat_turn(client, chat_body(user("ERROR 500"), {"role": "assistant", "content": "no"},
                                          {"role": "user", "content": parts}))
    assert turn["content"] == "from"


def test_chat_reasoning_say_and_parallel_calls_resolved_by_suffix(fake: FakeAnthropic,
                                                                  client: httpx2.Client) -> None:
    prompt = ('THINK two reads\nSAY Reading\nCALL workspace_read {"path": "a.txt"}\n'
              'CALL codesdk_echo {"text": "é"}\nCALL dup {}')
    turn, _ = chat_turn(client, chat_body(user(prompt)))
    assert turn["reasoning"] == "two reads" and turn["content"] == "Reading"
    assert turn["finish_reason"] == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in turn["calls"]] == [
        ("codesdk_workspace_read", {"path": "a.txt"}), ("codesdk_echo", {"text": "é"}), ("dup", {})]
    ids = [c["id"] for c in turn["calls"]]
    assert len(set(ids)) == 3 and all(i.startswith("call_") for i in ids)
    logged = fake.requests(CHAT_PATH)[-1]["reply"]["content"]
    assert [b["id"] for b in logged if b["type"] == "tool_use"] == ids


def test_chat_results_quote_the_tool_messages(client: httpx2.Client) -> None:
    calls = [{"id": i, "type": "function", "function": {"name": n, "arguments": "{}"}}
             for i, n in (("call_1", "codesdk_workspace_read"), ("call_2", "codesdk_echo"))]
    history = [user('CALL workspace_read {"path": "a.txt"}'),
               {"role": "assistant", "content": "", "tool_calls": calls},
               {"role": "tool", "tool_call_id": "call_1", "content": "alpha"},
               {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "z" * 400}]},
               {"role": "tool", "tool_call_id": "call_x", "content": "DENIED by policy: no"}]
    turn, _ = chat_turn(client, chat_body(*history))
    assert turn["finish_reason"] == "stop" and turn["calls"] == []
    assert turn["content"] == ("RESULTS: call_1(codesdk_workspace_read)=alpha | call_2(codesdk_echo)="
                               + "z" * RESULT_CUT + " | call_x=DENIED by policy: no")
    # A new prompt after them is read as a prompt: the old results are history.
    turn, _ = chat_turn(client, chat_body(*history, user("SAY next")))
    assert turn["content"] == "next"


def test_chat_title_request_gets_a_title_and_runs_no_directive(fake: FakeAnthropic,
                                                               client: httpx2.Client) -> None:
    payload = {"model": "fake-small", "max_tokens": 32000, "stream": True, "messages": [
        {"role": "system", "content": "You are a title generator. You output ONLY a thread title."},
        {"role": "user", "content": "Generate a title for this conversation:\n"},
        {"role": "user", "content": 'ERROR 500\nCALL workspace_read {"path": "a"}'}]}
    turn, _ = chat_turn(client, payload)
    assert turn["content"] == chat_completions.TITLE and turn["finish_reason"] == "stop"
    assert turn["model"] == "fake-small"
    logged = fake.requests(CHAT_PATH)[-1]
    assert logged["body"] == payload and logged["reply"]["status"] == 200
    # With tools it is a normal request, whatever its system prompt says.
    resp = post_chat(client, {**payload, "tools": CHAT_TOOLS})
    assert resp.status_code == 500


def test_chat_model_directive_names_the_served_model(client: httpx2.Client) -> None:
    turn, _ = chat_turn(client, chat_body(user("MODEL gpt-9\nSAY hi")))
    assert turn["model"] == "gpt-9" and turn["content"] == "hi"


@pytest.mark.parametrize(("status", "kind", "retry"), [
    (400, "invalid_request_error", False), (401, "invalid_request_error", False),
    (404, "not_found_error", False),
    (429, "rate_limit_exceeded", True), (500, "server_error", True), (503, "server_error", True),
    (529, "server_error", True)])
def test_chat_http_errors_have_openai_bodies_and_fast_retries(client: httpx2.Client, status: int, kind: str,
                                                              retry: bool) -> None:
    resp = post_chat(client, chat_body(user(f"ERROR {status}")))
    assert resp.status_code == status and resp.headers["content-type"] == "application/json"
    assert resp.json() == {"error": {"message": f"fake error: HTTP {status} ({kind})", "type": kind,
                                     "param": None, "code": kind}}
    assert resp.headers.get("retry-after-ms") == ("10" if retry else None)
    assert resp.headers.get("retry-after") == ("0" if retry else None)


def test_chat_prompt_too_long(client: httpx2.Client) -> None:
    resp = post_chat(client, chat_body(user("ERROR prompt_too_long")))
    assert resp.status_code == 400 and "retry-after-ms" not in resp.headers
    assert resp.json()["error"] == {"message": chat_completions.CONTEXT_TOO_LONG,
                                    "type": "invalid_request_error", "param": None,
                                    "code": "context_length_exceeded"}


def test_chat_error_mid_stream(client: httpx2.Client) -> None:
    resp = post_chat(client, chat_body(user("ERROR stream")))
    assert resp.status_code == 200
    *chunks, error = data_events(resp.content)
    assert chunks and all(c["choices"][0]["delta"]["content"] for c in chunks)
    assert error == {"error": {"message": chat_completions.STREAM_FAILURE, "type": "server_error",
                               "param": None, "code": "server_error"}}


def test_chat_bad_body(client: httpx2.Client) -> None:
    resp = client.post(CHAT_PATH, content=b"not json")
    assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error"


# --- both: pacing, disconnects, the log ---------------------------------------------------------------------

def stream_request(dialect: str, prompt: str) -> tuple[str, dict[str, Any]]:
    if dialect == "gemini":
        return f"{GEMINI_PATH}?alt=sse", gemini_body(prompt)
    return CHAT_PATH, chat_body(user(prompt))


def text_of_event(line: str) -> str:
    event = json.loads(line.removeprefix("data: "))
    if "candidates" in event:
        return str(event["candidates"][0]["content"]["parts"][0].get("text", ""))
    choices = event.get("choices") or [{}]
    return str(choices[0].get("delta", {}).get("content", ""))


@pytest.mark.parametrize("dialect", ["gemini", "chat"])
def test_slow_streams_over_time(client: httpx2.Client, dialect: str) -> None:
    path, payload = stream_request(dialect, "SLOW 0.6")
    started, stamps, text = time.monotonic(), [], ""
    with client.stream("POST", path, json=payload) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: {") and (piece := text_of_event(line)):
                stamps.append(time.monotonic() - started)
                text += piece
    assert text == "tick 1 tick 2 tick 3 tick 4 tick 5 tick 6 "
    assert len(stamps) == 6 and stamps[-1] - stamps[0] >= 0.35


@pytest.mark.parametrize("dialect", ["gemini", "chat"])
def test_client_abort_is_logged(fake: FakeAnthropic, dialect: str) -> None:
    path, payload = stream_request(dialect, "SLOW 30")
    with httpx2.Client(base_url=fake.base_url, timeout=TIMEOUT) as http, \
            http.stream("POST", path, json=payload) as resp:
        request_id = resp.headers["x-request-id"]
        for line in resp.iter_lines():
            if line.startswith("data: {") and text_of_event(line):
                break
    wait_for("the abort to be logged", lambda: any(
        e.get("type") == "disconnect" and e["request_id"] == request_id and e["events_sent"] >= 1
        for e in fake.entries()))


def test_log_has_every_request_with_keys_redacted(tmp_path: Path) -> None:
    with FakeAnthropic.start(tmp_path / "api.jsonl") as fake, \
            httpx2.Client(base_url=fake.base_url, timeout=TIMEOUT) as http:
        assert fake.gemini_base_url == fake.base_url
        assert fake.chat_completions_base_url == f"{fake.base_url}/v1"
        post_gemini(http, gemini_body("one"))
        post_chat(http, chat_body(user("ERROR 429")))
        logged = fake.requests()
    assert [(e["method"], e["path"], e["query"]) for e in logged] == [
        ("POST", GEMINI_PATH, "alt=sse"), ("POST", CHAT_PATH, "")]
    first, second = logged
    assert first["body"] == gemini_body("one") and first["stream"] is True
    assert first["has_api_key"] and first["headers"]["x-goog-api-key"] == "<redacted>"
    assert first["reply"]["status"] == 200
    assert first["reply"]["content"] == [{"type": "text", "text": "Echo: one"}]
    assert second["has_authorization"] and second["headers"]["authorization"] == "<redacted>"
    assert second["reply"] == {"status": 429, "error": "rate_limit_exceeded",
                               "message": "fake error: HTTP 429 (rate_limit_exceeded)"}
    assert "gm-secret" not in fake.log_path.read_text() and "oc-secret" not in fake.log_path.read_text()


# --- pure functions -----------------------------------------------------------------------------------------

names = st.from_regex(r"[a-z][a-z0-9]{0,8}(_[a-z0-9]{1,6}){0,2}", fullmatch=True)


@given(server=names, tool=names)
def test_resolve_tool_finds_one_underscore_names_only_when_asked(server: str, tool: str) -> None:
    gemini_name, opencode_name = f"mcp_{server}_{tool}", f"{server}_{tool}"
    assert resolve_tool(tool, [{"name": gemini_name}], gemini.SEPARATORS) == gemini_name
    assert resolve_tool(tool, [{"name": opencode_name}], chat_completions.SEPARATORS) == opencode_name
    assert resolve_tool(tool, [{"name": gemini_name}]) == tool  # the Messages dialect: ``__`` only
    # Exact names win, then ``__`` (Claude Code's), then ``_``.
    assert resolve_tool(tool, [{"name": gemini_name}, {"name": tool}], gemini.SEPARATORS) == tool
    claude_name = f"mcp__{server}__{tool}"
    both = [{"name": gemini_name}, {"name": claude_name}]
    assert resolve_tool(tool, both, gemini.SEPARATORS) == claude_name
    # Ambiguous: the name as given.
    twins = [{"name": gemini_name}, {"name": f"x{opencode_name}"}]
    assert resolve_tool(tool, twins, gemini.SEPARATORS) == tool


plain = st.text().filter(lambda t: "session_context>" not in t)


@given(plain, plain)
def test_gemini_prompt_drops_the_session_context(context: str, prompt: str) -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": f"<session_context>{context}</session_context>"},
                                                    {"text": prompt}]}]}
    assert gemini.prompt_of(body) == prompt.strip()


@given(st.text().filter(lambda t: "untrusted_context>" not in t))
def test_gemini_response_text_unwraps_tool_output(text: str) -> None:
    wrapped = f"<untrusted_context>\n{text}\n</untrusted_context>"
    assert gemini.response_text({"output": wrapped}) == text.strip()
    assert gemini.response_text({"error": text}) == text.strip()
    assert gemini.response_text({"other": 1}) == '{"other": 1}'


def test_gemini_function_responses_only_of_the_last_user_content() -> None:
    response = {"functionResponse": {"id": "x", "name": "f", "response": {"output": "o"}}}
    answered = {"contents": [{"role": "user", "parts": [{"text": "p"}]}, {"role": "model", "parts": []},
                             {"role": "user", "parts": [response]}]}
    assert gemini.function_responses(answered) == [response["functionResponse"]]
    later = {"contents": [*answered["contents"], {"role": "model", "parts": [{"text": "RESULTS"}]},
                          {"role": "user", "parts": [{"text": "next"}]}]}
    assert gemini.function_responses(later) == [] and gemini.prompt_of(later) == "next"
    tools = [{"functionDeclarations": [{"name": "a"}, {}]}, {"googleSearch": {}}]
    assert gemini.declared_tools({"tools": tools}) == ["a"]


def test_chat_title_detection_needs_no_tools_and_the_title_prompt() -> None:
    system = {"role": "system", "content": [{"type": "text", "text": "You are a title generator. Be short."}]}
    assert chat_completions.is_title_request({"messages": [system, user("x")]})
    assert chat_completions.is_title_request({"messages": [system], "tools": []})
    assert not chat_completions.is_title_request({"messages": [system], "tools": CHAT_TOOLS})
    opencode = {"role": "system", "content": "You are opencode"}
    assert not chat_completions.is_title_request({"messages": [opencode]})
