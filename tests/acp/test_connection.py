"""The connection loop against whatever a client may write: each line is answered as JSON-RPC says (a request
with its result or an error, a notification or an answer with nothing), the loop never dies, and every line it
writes is one JSON-RPC message. Its service is unreachable here: a request that needs it is an error, not a crash."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codesdk.client import AsyncClient
from codesdk.supervisor.cli.acp.server import Defaults, run_connection

METHODS = ["initialize", "authenticate", "session/new", "session/load", "session/resume", "session/list",
           "session/prompt", "session/set_config_option", "session/cancel", "nope", "$/cancel_request"]
#: The agent's methods a client may call only once it has called ``initialize``.
AFTER_INITIALIZE = {"authenticate", "session/new", "session/load", "session/resume", "session/list",
                    "session/prompt", "session/set_config_option"}
values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                  max_size=3), max_leaves=8)
#: Ids as JSON-RPC takes them (string, integer, null) and as it does not (true, an object, a fraction, past int64).
ids = st.integers(0, 9) | st.text(max_size=3) | st.none() | st.integers(2**63 - 2, 2**64) | st.floats(
    allow_nan=False, allow_infinity=False) | values
messages = st.fixed_dictionaries({"jsonrpc": st.just("2.0")},
                                 optional={"method": st.sampled_from(METHODS) | values, "id": ids, "params": values,
                                           "result": values, "error": values})
lines = st.one_of(messages.map(lambda m: json.dumps(m).encode()), st.binary(max_size=40).filter(lambda b: b"\n" not in b),
                  values.map(lambda v: json.dumps(v).encode()))


async def converse(sent: list[bytes], socket: Path) -> list[dict[str, Any]]:
    """What ``codesdk acp``'s loop writes for ``sent`` (then end of input), with its service unreachable."""
    stdin_send, stdin_receive = trio.testing.memory_stream_one_way_pair()
    stdout_send, stdout_receive = trio.testing.memory_stream_one_way_pair()
    out = bytearray()

    async def read_all() -> None:
        while data := await stdout_receive.receive_some(65536):
            out.extend(data)

    async with AsyncClient(socket=socket, token="t") as client:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_all)
                async with stdout_send:
                    async with trio.open_nursery() as inner:
                        inner.start_soon(run_connection, client, Defaults(), stdin_receive, stdout_send)
                        for line in sent:
                            await stdin_send.send_all(line + b"\n")
                        await stdin_send.aclose()
    return [json.loads(line) for line in out.splitlines()]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(lines, max_size=6))
def test_every_line_gets_its_answer_and_only_protocol_comes_out(sent: list[bytes]) -> None:
    written = trio.run(converse, sent, Path("/nonexistent/codesdk-acp-test.sock"))
    for message in written:
        assert message["jsonrpc"] == "2.0" and ("result" in message) != ("error" in message), message
        assert _is_jsonrpc_id(message["id"]), message  # an id we cannot echo is answered with null
    expected_ids: Counter[str] = Counter()
    expected_codes: Counter[tuple[str, int]] = Counter()
    initialize_sent = False
    for line in sent:
        expected = _expected_answer(line, initialize_sent)
        initialize_sent = initialize_sent or b'"initialize"' in line
        if expected is not None:
            expected_ids[json.dumps(expected[0])] += 1
            if expected[1] is not None:
                expected_codes[json.dumps(expected[0]), expected[1]] += 1
    assert Counter(json.dumps(m["id"]) for m in written) == expected_ids  # one answer per line that needs one
    answered_codes = Counter((json.dumps(m["id"]), m["error"]["code"]) for m in written if "error" in m)
    assert not expected_codes - answered_codes


def _expected_answer(line: bytes, initialize_sent: bool) -> tuple[object, int | None] | None:
    """What JSON-RPC 2.0 (and ACP) say a line gets: None (nothing: a notification, an answer), else the answer's id
    and, where this model can tell, its error code."""
    if not line.strip():
        return None  # a blank line is no message
    try:
        value = json.loads(line)
    except ValueError:
        return None, None  # not JSON: a parse error
    if not isinstance(value, dict) or value.get("jsonrpc") != "2.0":
        return None, None
    if not _is_jsonrpc_id(value.get("id")):
        return None, -32600
    method = value.get("method")
    if method is None:
        answer = "id" in value and ("result" in value) != ("error" in value)
        return None if answer else (value.get("id"), -32600)
    if not isinstance(method, str):
        return value.get("id"), -32600
    if "id" not in value:
        return None
    if method in AFTER_INITIALIZE and not initialize_sent:
        return value["id"], -32600
    return value["id"], -32601 if method not in METHODS or method in {"session/cancel", "$/cancel_request"} else None


def _is_jsonrpc_id(value: object) -> bool:
    return value is None or isinstance(value, str) or (type(value) is int and -2**63 <= value < 2**63)
