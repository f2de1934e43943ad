"""The connection loop against whatever a client may write: each line is answered as JSON-RPC says (a request
with its result or an error, a notification or an answer with nothing), the loop never dies, and every line it
writes is one JSON-RPC message. Its service is unreachable here: a request that needs it is an error, not a crash."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codesdk.client import AsyncClient
from codesdk.supervisor.cli.acp.server import Defaults, run_connection

METHODS = ["initialize", "authenticate", "session/new", "session/load", "session/resume", "session/list",
           "session/prompt", "session/set_config_option", "session/cancel", "nope", "$/cancel_request"]
values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                  max_size=3), max_leaves=8)
messages = st.fixed_dictionaries({"jsonrpc": st.just("2.0"), "method": st.sampled_from(METHODS)},
                                 optional={"id": st.integers(0, 9) | st.text(max_size=3), "params": values})
lines = st.one_of(messages.map(lambda m: json.dumps(m).encode()), st.binary(max_size=40).filter(lambda b: b"\n" not in b),
                  values.map(lambda v: json.dumps(v).encode()))


async def converse(sent: list[bytes], socket: Path) -> list[dict[str, object]]:
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


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(lines, max_size=6))
def test_every_line_gets_its_answer_and_only_protocol_comes_out(sent: list[bytes]) -> None:
    written = trio.run(converse, sent, Path("/nonexistent/codesdk-acp-test.sock"))
    for message in written:
        assert message["jsonrpc"] == "2.0" and ("result" in message) != ("error" in message), message
    requests = Counter(json.dumps(json.loads(line)["id"]) for line in sent if _is_request(line))
    answered = Counter(json.dumps(m["id"]) for m in written)
    assert not requests - answered  # each request answered (and each bad line too, with its id or null)


def _is_request(line: bytes) -> bool:
    try:
        value = json.loads(line)
    except ValueError:
        return False
    return isinstance(value, dict) and "id" in value and isinstance(value.get("method"), str)
