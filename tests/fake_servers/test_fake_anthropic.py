"""The fake Anthropic Messages API (fixtures/fake_anthropic) against its real subprocess, over plain HTTP."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from fixtures.fake_anthropic import FakeAnthropic
from fixtures.fake_anthropic.scenario import PROMPT_TOO_LONG, Reply, decide
from codesdk.protocol import Message, runtime_prompt

from tests.waits import wait_for

TIMEOUT = 10.0
TOOLS = [{"name": "Read", "input_schema": {"type": "object"}},
         {"name": "mcp__codesdk__echo", "input_schema": {"type": "object"}},
         {"name": "mcp__codesdk__read", "input_schema": {"type": "object"}},
         {"name": "mcp__a__dup", "input_schema": {"type": "object"}},
         {"name": "mcp__b__dup", "input_schema": {"type": "object"}}]


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeAnthropic]:
    with FakeAnthropic.start(tmp_path_factory.mktemp("fake") / "api.jsonl") as server:
        yield server


def body(content: Any, *, stream: bool = True, history: list[dict[str, Any]] | None = None,
         **extra: Any) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": stream, "tools": TOOLS,
            "messages": [*(history or []), {"role": "user", "content": content}], **extra}


def post(fake: FakeAnthropic, payload: Any, path: str = "/v1/messages?beta=true",
         method: str = "POST") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=TIMEOUT)
    try:
        data = None if payload is None else json.dumps(payload).encode()
        conn.request(method, path, body=data, headers={"x-api-key": "sk-test", "anthropic-version": "2023-06-01",
                                                       "content-type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def parse_sse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for frame in raw.decode().split("\n\n"):
        if not frame.strip():
            continue
        lines = dict(line.split(": ", 1) for line in frame.splitlines())
        data = json.loads(lines["data"])
        assert data["type"] == lines["event"]
        events.append((lines["event"], data))
    return events


def assemble(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Rebuild the message from its stream the way an SDK does, checking the event grammar on the way."""
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("ping") == 1
    message = dict(events[0][1]["message"])
    assert message["content"] == [] and message["stop_reason"] is None
    blocks: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    open_index: int | None = None
    for name, data in events[1:-2]:
        if name == "content_block_start":
            assert open_index is None and data["index"] == len(blocks)
            open_index = data["index"]
            blocks.append(dict(data["content_block"]))
            partial[open_index] = ""
        elif name == "content_block_delta":
            assert open_index is not None and data["index"] == open_index
            delta = data["delta"]
            if delta["type"] == "text_delta":
                blocks[open_index]["text"] += delta["text"]
            else:
                assert delta["type"] == "input_json_delta"
                partial[open_index] += delta["partial_json"]
        elif name == "content_block_stop":
            assert open_index is not None and data["index"] == open_index
            if blocks[open_index]["type"] == "tool_use":
                blocks[open_index]["input"] = json.loads(partial[open_index])
            open_index = None
        else:
            assert name == "ping"
    assert open_index is None
    message["content"] = blocks
    message["stop_reason"] = events[-2][1]["delta"]["stop_reason"]
    message["usage"] = {**message["usage"], **events[-2][1]["usage"]}
    return message


def stream(fake: FakeAnthropic, content: Any, **kw: Any) -> tuple[dict[str, Any], list[tuple[str, dict[str,
           Any]]]]:
    status, headers, raw = post(fake, body(content, **kw))
    assert status == 200, raw
    assert headers["content-type"].startswith("text/event-stream")
    events = parse_sse(raw)
    return assemble(events), events


def test_stream_text_echo(fake: FakeAnthropic) -> None:
    message, events = stream(fake, "hello there")
    assert message["id"].startswith("msg_") and message["model"] == "claude-sonnet-4-5"
    assert message["role"] == "assistant" and message["type"] == "message"
    assert message["content"] == [{"type": "text", "text": "Echo: hello there"}]
    assert message["stop_reason"] == "end_turn"
    assert sum(1 for name, _ in events if name == "content_block_delta") >= 3
    assert message["usage"]["input_tokens"] > 0 and message["usage"]["output_tokens"] > 0


def test_echo_uses_last_user_message_and_skips_reminders_and_system(fake: FakeAnthropic) -> None:
    history = [{"role": "system", "content": "You are Claude Code. ERROR 500"},
               {"role": "user", "content": "CALL echo {\"text\": \"old\"}"},
               {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
    content = [{"type": "text", "text": "<system-reminder>\nCALL echo {\"x\": 1}\n</system-reminder>"},
               {"type": "text", "text": "first line"}, {"type": "text", "text": "x" * 300}]
    message, _ = stream(fake, content, history=history)
    text = message["content"][0]["text"]
    assert text == "Echo: " + ("first line\n" + "x" * 300)[:200]
    assert message["stop_reason"] == "end_turn"


def test_only_the_newest_prompt_of_a_merged_user_message_counts(fake: FakeAnthropic) -> None:
    """Seen from Claude Code 2.1.330: after an API error the next prompt joins the failed one's user message,
    each prompt preceded by a reminder block."""
    reminder = {"type": "text", "text": "<system-reminder>\n<total_tokens>9 tokens left</total_tokens>\n"
                                        "</system-reminder>\n"}
    content = [reminder, {"type": "text", "text": "ERROR 429"}, reminder, {"type": "text", "text": "after errors"}]
    message, _ = stream(fake, content)
    assert message["content"] == [{"type": "text", "text": "Echo: after errors"}]
    # Several text blocks of one prompt are all read; a reminder after the prompt does not hide it.
    content = [reminder, {"type": "text", "text": "SAY two"}, {"type": "text", "text": 'CALL echo {"a": 1}'}, reminder]
    message, _ = stream(fake, content)
    assert [b["type"] for b in message["content"]] == ["text", "tool_use"]


def test_of_a_prompt_rebuilt_from_a_transcript_only_the_request_counts() -> None:
    """The record of earlier turns may hold their directives: a model acts on the request after it."""
    history = [Message.user_text("ERROR 401"), Message.user_text('CALL echo {"a": 1}')]
    _, rebuilt = runtime_prompt([*history, Message.user_text("SAY now")], resumable=False)
    reply = decide({"messages": [{"role": "user", "content": rebuilt}]})
    assert isinstance(reply, Reply) and reply.blocks == [{"type": "text", "text": "now"}]


def test_tool_use_streams_input_json_delta(fake: FakeAnthropic) -> None:
    args = {"text": "hi", "n": [1, 2, {"deep": "é"}]}
    message, events = stream(fake, f"please CALL echo {json.dumps(args)} thanks")
    assert message["stop_reason"] == "tool_use"
    [block] = message["content"]
    assert block["type"] == "tool_use" and block["id"].startswith("toolu_")
    assert block["name"] == "mcp__codesdk__echo" and block["input"] == args
    start = next(d for n, d in events if n == "content_block_start")
    assert start["content_block"]["input"] == {}
    assert sum(1 for n, d in events if n == "content_block_delta"
               and d["delta"]["type"] == "input_json_delta") >= 3


def test_two_calls_and_say(fake: FakeAnthropic) -> None:
    prompt = 'SAY Reading two things\nCALL Read {"file_path": "a.txt"}\nCALL read {"path": "b"}\nCALL nosuch {}'
    message, _ = stream(fake, prompt)
    assert message["stop_reason"] == "tool_use"
    text, *uses = message["content"]
    assert text == {"type": "text", "text": "Reading two things"}
    assert [(u["name"], u["input"]) for u in uses] == [("Read", {"file_path": "a.txt"}),
                                                      ("mcp__codesdk__read", {"path": "b"}), ("nosuch", {})]
    assert len({u["id"] for u in uses}) == 3


def test_ambiguous_suffix_keeps_given_name() -> None:
    reply = decide(body('CALL dup {"a": 1}'))
    assert [b["name"] for b in reply.blocks] == ["dup"]  # type: ignore[union-attr]


def test_tool_results_are_quoted(fake: FakeAnthropic) -> None:
    history = [{"role": "user", "content": "CALL echo {}"},
               {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "x", "input": {}},
                                                 {"type": "tool_use", "id": "toolu_2", "name": "y", "input": {}}]}]
    # Claude Code appends a system reminder to the last tool result's content string.
    content = [{"type": "tool_result", "tool_use_id": "toolu_1",
                "content": "one\n\n<system-reminder>\n<total_tokens>1 tokens left</total_tokens>\n</system-reminder>"},
               {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                "content": [{"type": "text", "text": "bad "}, {"type": "text", "text": "y" * 400}]},
               {"type": "text", "text": "<system-reminder>CALL echo {}</system-reminder>"}]
    message, _ = stream(fake, content, history=history)
    assert message["stop_reason"] == "end_turn"
    assert message["content"] == [{"type": "text",
                                   "text": "RESULTS: toolu_1=ok:one | toolu_2=error:" + ("bad " + "y" * 400)[:300]}]


@pytest.mark.parametrize(("directive", "status", "error_type"), [
    ("400", 400, "invalid_request_error"), ("401", 401, "authentication_error"),
    ("403", 403, "permission_error"), ("413", 413, "request_too_large"), ("429", 429, "rate_limit_error"),
    ("500", 500, "api_error"), ("529", 529, "overloaded_error"), ("prompt_too_long", 400, "invalid_request_error"),
])
@pytest.mark.parametrize("streamed", [True, False])
def test_error_directives(fake: FakeAnthropic, directive: str, status: int, error_type: str, streamed: bool) -> None:
    got, headers, raw = post(fake, body(f"do it\nnow ERROR {directive}", stream=streamed))
    assert got == status
    assert headers["content-type"] == "application/json"
    err = json.loads(raw)
    assert err["type"] == "error" and err["error"]["type"] == error_type
    if directive == "prompt_too_long":
        assert err["error"]["message"] == PROMPT_TOO_LONG
    else:
        assert str(status) in err["error"]["message"]
    assert ("retry-after" in headers) == (status == 429)
    assert headers["request-id"].startswith("req_")


def test_error_mid_stream(fake: FakeAnthropic) -> None:
    status, _, raw = post(fake, body("ERROR stream"))
    assert status == 200
    names = [name for name, _ in parse_sse(raw)]
    assert names[0] == "message_start" and "content_block_delta" in names
    assert names[-1] == "error" and "message_stop" not in names


def test_error_stream_retried_without_stream_gets_529(fake: FakeAnthropic) -> None:
    status, _, raw = post(fake, body("ERROR stream", stream=False))
    assert status == 529 and json.loads(raw)["error"]["type"] == "overloaded_error"


def test_slow_streams_over_time(fake: FakeAnthropic) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=TIMEOUT)
    try:
        conn.request("POST", "/v1/messages", body=json.dumps(body("SLOW 0.6")),
                     headers={"content-type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        started, stamps, raw = time.monotonic(), [], b""
        while line := resp.readline():
            raw += line
            if line.startswith(b"event: content_block_delta"):
                stamps.append(time.monotonic() - started)
    finally:
        conn.close()
    message = assemble(parse_sse(raw))
    assert message["stop_reason"] == "end_turn"
    assert message["content"][0]["text"] == "tick 1 tick 2 tick 3 tick 4 tick 5 tick 6 "
    assert len(stamps) == 6 and stamps[-1] - stamps[0] >= 0.35


def test_slow_client_abort_is_logged(fake: FakeAnthropic) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=TIMEOUT)
    try:
        conn.request("POST", "/v1/messages", body=json.dumps(body("SLOW 30")),
                     headers={"content-type": "application/json"})
        resp = conn.getresponse()
        while not resp.readline().startswith(b"event: content_block_delta"):
            pass
        request_id = resp.getheader("request-id")
    finally:
        conn.close()
    wait_for("the abort to be logged", lambda: any(
        e.get("type") == "disconnect" and e["request_id"] == request_id for e in fake.entries()))


def test_non_stream_message(fake: FakeAnthropic) -> None:
    status, headers, raw = post(fake, body('CALL echo {"text": "hi"}', stream=False))
    assert status == 200 and headers["content-type"] == "application/json"
    message = json.loads(raw)
    assert message["type"] == "message" and message["id"].startswith("msg_")
    assert message["model"] == "claude-sonnet-4-5" and message["stop_reason"] == "tool_use"
    assert message["content"][0]["name"] == "mcp__codesdk__echo" and message["content"][0]["input"] == {"text": "hi"}
    assert message["usage"]["input_tokens"] > 0 and message["usage"]["output_tokens"] > 0

    status, _, raw = post(fake, body("hi", stream=False))
    assert json.loads(raw)["content"] == [{"type": "text", "text": "Echo: hi"}]


def test_other_endpoints(fake: FakeAnthropic) -> None:
    status, _, raw = post(fake, body("count me"), path="/v1/messages/count_tokens")
    assert status == 200 and json.loads(raw)["input_tokens"] > 0
    assert post(fake, None, path="/", method="HEAD")[:1] == (200,)
    assert post(fake, None, path="/", method="GET")[::2] == (200, b"")
    for method, path in [("GET", "/v1/models"), ("POST", "/v1/complete"), ("GET", "/v1/messages")]:
        status, _, raw = post(fake, None, path=path, method=method)
        assert status == 404 and json.loads(raw)["error"]["type"] == "not_found_error"
    status, _, raw = post(fake, None)
    assert status == 400 and json.loads(raw)["error"]["type"] == "invalid_request_error"


def test_log_has_every_request(tmp_path: Path) -> None:
    with FakeAnthropic.start(tmp_path / "api.jsonl") as fake:
        sent = [("POST", "/v1/messages?beta=true", body("one")), ("POST", "/v1/messages", body("ERROR 529")),
                ("POST", "/v1/messages/count_tokens", body("x")), ("HEAD", "/", None), ("GET", "/nope", None)]
        for method, path, payload in sent:
            post(fake, payload, path=path, method=method)
            # Logged before the answer: the line is there as soon as the response is.
            assert len(fake.requests()) == sent.index((method, path, payload)) + 1
        logged = fake.requests()
    assert [(e["method"], e["path"], e["query"]) for e in logged] == [
        ("POST", "/v1/messages", "beta=true"), ("POST", "/v1/messages", ""), ("POST", "/v1/messages/count_tokens", ""),
        ("HEAD", "/", ""), ("GET", "/nope", "")]
    first = logged[0]
    assert first["body"] == body("one") and first["has_api_key"] and first["anthropic_version"] == "2023-06-01"
    assert first["headers"]["x-api-key"] == "<redacted>"
    assert first["reply"]["stop_reason"] == "end_turn" and logged[1]["reply"]["status"] == 529
    assert [e["seq"] for e in logged] == [1, 2, 3, 4, 5]
    assert fake.proc.poll() is not None  # stopped


def test_binds_loopback_only(fake: FakeAnthropic) -> None:
    listening = [c.laddr for c in psutil.Process(fake.pid).net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN]
    assert listening == [("127.0.0.1", fake.port)]
    with pytest.raises(OSError), socket.create_connection(("127.0.0.2", fake.port), timeout=2):
        pass


def test_concurrent_requests_are_independent(fake: FakeAnthropic) -> None:
    conns = [http.client.HTTPConnection("127.0.0.1", fake.port, timeout=TIMEOUT) for _ in range(2)]
    try:
        conns[0].request("POST", "/v1/messages", body=json.dumps(body("SLOW 30")),
                         headers={"content-type": "application/json"})
        slow = conns[0].getresponse()
        assert slow.readline() == b"event: message_start\n"
        conns[1].request("POST", "/v1/messages", body=json.dumps(body("quick", stream=False)),
                         headers={"content-type": "application/json"})
        quick = json.loads(conns[1].getresponse().read())
        assert quick["content"][0]["text"] == "Echo: quick"
        # Answered while the slow stream is still going: it has not sent its end yet.
        rest = slow.read1(65536)
        assert b"message_stop" not in rest
    finally:
        for conn in conns:
            conn.close()


# --- the real Claude Code CLI against the fake (only inside a loopback-only network namespace) ----------------

CLAUDE = Path(__file__).resolve().parents[2] / ".venv/lib/python3.11/site-packages/claude_agent_sdk/_bundled/claude"
MCP_ECHO = '''
from mcp.server.mcpserver import MCPServer

app = MCPServer("srv")


@app.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return f"echoed: {text}"


app.run("stdio")
'''


def loopback_only() -> bool:
    return [name for _, name in socket.if_nameindex()] == ["lo"]


skip_outside_netns = pytest.mark.skipif(
    not loopback_only(), reason="real runtimes run only in a loopback-only network namespace (scripts/test)")
skip_without_claude = pytest.mark.skipif(not CLAUDE.exists(), reason="the bundled claude binary is not installed")


def run_claude(fake: FakeAnthropic, tmp_path: Path, prompt: str, *args: str) -> list[dict[str, Any]]:
    assert loopback_only()  # never let the real CLI near a real network
    home = tmp_path / "home"
    (home / "tmp").mkdir(parents=True)
    (home / "work").mkdir()
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": str(home / "tmp"), **fake.claude_env(home)}
    argv = [str(CLAUDE), "-p", prompt, "--output-format", "stream-json", "--verbose", "--strict-mcp-config",
            "--model", "claude-sonnet-4-5", *args]
    done = subprocess.run(argv, env=env, cwd=home / "work", stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=120, start_new_session=True, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return [json.loads(line) for line in done.stdout.decode().splitlines() if line.startswith("{")]


@pytest.mark.runtime
@skip_outside_netns
@skip_without_claude
def test_real_claude_cli_text_turn(tmp_path: Path) -> None:
    with FakeAnthropic.start(tmp_path / "api.jsonl") as fake:
        events = run_claude(fake, tmp_path, "hello", "--tools", "")
        [request] = fake.requests()
    result = events[-1]
    assert result["type"] == "result" and not result["is_error"] and result["result"] == "Echo: hello"
    assert (request["method"], request["path"], request["query"]) == ("POST", "/v1/messages", "beta=true")
    assert request["has_api_key"] and request["anthropic_version"] == "2023-06-01"
    body = request["body"]
    assert body["stream"] is True and body["model"] == "claude-sonnet-4-5" and body["tools"] == []
    assert isinstance(body["system"], list) and [m["role"] for m in body["messages"]] == ["user"]


@pytest.mark.runtime
@skip_outside_netns
@skip_without_claude
def test_real_claude_cli_mcp_tool_round_trip(tmp_path: Path) -> None:
    server = tmp_path / "mcp_echo.py"
    server.write_text(MCP_ECHO)
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"srv": {"type": "stdio", "command": sys.executable,
                                                         "args": [str(server)]}}}))
    with FakeAnthropic.start(tmp_path / "api.jsonl") as fake:
        events = run_claude(fake, tmp_path, 'CALL echo {"text": "hi"}', "--tools", "", "--mcp-config", str(config),
                            "--allowedTools", "mcp__srv__echo")
        first, second = fake.requests()
    assert [t["name"] for t in first["body"]["tools"]] == ["mcp__srv__echo"]
    [tool_use] = first["reply"]["content"]
    assert tool_use["name"] == "mcp__srv__echo" and tool_use["input"] == {"text": "hi"}
    assert [m["role"] for m in second["body"]["messages"]] == ["user", "assistant", "user"]
    [tool_result] = second["body"]["messages"][-1]["content"]
    assert tool_result["type"] == "tool_result" and tool_result["tool_use_id"] == tool_use["id"]
    assert "echoed: hi" in tool_result["content"] and not tool_result.get("is_error")
    result = events[-1]
    assert result["type"] == "result" and not result["is_error"]
    assert result["result"].startswith(f"RESULTS: {tool_use['id']}=ok:") and "echoed: hi" in result["result"]


# -- the OpenAI Responses dialect (Codex) ----------------------------------------------------------------------

RESPONSES_TOOLS = [{"type": "function", "name": "workspace_read", "parameters": {"type": "object"}},
                   {"type": "function", "name": "request_user_input", "parameters": {"type": "object"}}]


def responses_body(prompt: str, *history: dict[str, Any]) -> dict[str, Any]:
    """A request as Codex makes it: developer instructions, its environment context, then the prompt."""
    return {"model": "fake-model", "stream": True, "tools": RESPONSES_TOOLS, "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be helpful"}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "<environment_context><cwd>/ws</cwd></environment_context>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]}, *history]}


def post_responses(fake: FakeAnthropic, payload: Any) -> tuple[int, list[tuple[str, dict[str, Any]]], bytes]:
    status, _, raw = post(fake, payload, path="/v1/responses")
    return status, (parse_sse(raw) if status == 200 else []), raw


def test_responses_text_streams_then_completes_with_usage(fake: FakeAnthropic) -> None:
    status, events, _ = post_responses(fake, responses_body("SAY hello from the fake"))
    assert status == 200
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert all(data["type"] == kind for kind, data in events)
    text = "".join(d["delta"] for k, d in events if k == "response.output_text.delta")
    assert text == "hello from the fake" and kinds.count("response.output_text.delta") >= 2
    usage = events[-1][1]["response"]["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > 0


def test_responses_reasoning_then_parallel_function_calls(fake: FakeAnthropic) -> None:
    prompt = 'THINK first I look\nCALL workspace_read {"path": "a.txt"}\nCALL workspace_read {"path": "b.txt"}'
    _, events, _ = post_responses(fake, responses_body(prompt))
    items = [d["item"] for k, d in events if k == "response.output_item.done"]
    assert [i["type"] for i in items] == ["reasoning", "function_call", "function_call"]
    assert items[0]["summary"] == [{"type": "summary_text", "text": "first I look"}]
    calls = items[1:]
    assert [json.loads(c["arguments"]) for c in calls] == [{"path": "a.txt"}, {"path": "b.txt"}]
    assert len({c["call_id"] for c in calls}) == 2 and all(c["name"] == "workspace_read" for c in calls)


def test_responses_calls_a_namespaced_mcp_tool_by_its_namespace_and_name(fake: FakeAnthropic) -> None:
    """Codex (through codex-acp) offers an MCP server's tools as a ``namespace`` tool (``mcp__<server>``)."""
    body = responses_body('CALL workspace_read {"path": "a.txt"}\nCALL request_user_input {}')
    body["tools"] = [*RESPONSES_TOOLS[1:], {"type": "namespace", "name": "mcp__codesdk", "tools": [
        {"type": "function", "name": "workspace_read", "parameters": {"type": "object"}}]}]
    _, events, _ = post_responses(fake, body)
    calls = [d["item"] for k, d in events if k == "response.output_item.done"]
    assert [(c.get("namespace"), c["name"]) for c in calls] == [("mcp__codesdk", "workspace_read"),
                                                                 (None, "request_user_input")]


def test_responses_answer_quotes_the_function_outputs(fake: FakeAnthropic) -> None:
    history = [{"type": "function_call", "call_id": "call_1", "name": "workspace_read", "arguments": "{}"},
               {"type": "function_call_output", "call_id": "call_1", "output": "alpha"},
               {"type": "function_call_output", "call_id": "call_2", "output": "DENIED: not today"}]
    _, events, _ = post_responses(fake, responses_body('CALL workspace_read {"path": "a.txt"}', *history))
    [item] = [d["item"] for k, d in events if k == "response.output_item.done"]
    assert item["content"][0]["text"] == "RESULTS: call_1=alpha | call_2=DENIED: not today"


@pytest.mark.parametrize(("status", "kind"), [(401, "invalid_request_error"), (429, "rate_limit_exceeded"),
                                              (500, "server_error")])
def test_responses_http_errors_have_openai_bodies(fake: FakeAnthropic, status: int, kind: str) -> None:
    got, _, raw = post_responses(fake, responses_body(f"ERROR {status}"))
    assert got == status and json.loads(raw)["error"]["type"] == kind


def test_responses_failures_in_the_stream(fake: FakeAnthropic) -> None:
    _, events, _ = post_responses(fake, responses_body("ERROR prompt_too_long"))
    assert events[-1][0] == "response.failed"
    assert events[-1][1]["response"]["error"]["code"] == "context_length_exceeded"
    _, events, _ = post_responses(fake, responses_body("ERROR stream"))
    kinds = [kind for kind, _ in events]
    assert "response.output_text.delta" in kinds and kinds[-1] == "response.failed"
    assert events[-1][1]["response"]["error"]["code"] == "server_error"
