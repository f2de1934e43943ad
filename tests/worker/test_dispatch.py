"""The worker's request dispatch, byte for byte on the wire, and the supervisor's typed requests.

The answers below are the ones the worker gave when it dispatched through jsonrpcserver; dispatching through
protocol's method table keeps them exactly (codes, messages, ``data`` present, null or left out, member order,
ids echoed as sent, notifications executed and never answered).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio
import trio.testing

from codesdk.testing import open_worker
from codesdk.protocol import (
    PROTOCOL_VERSION,
    AuthStatus,
    ErrorCode,
    GetAuthStatusParams,
    MessageReader,
    NoParams,
    Request,
    Response,
    Rpc,
    StartTaskParams,
    StartTaskResult,
    StopParams,
    encode_message,
)
from codesdk.worker.client import RpcError, WorkerConnection, worker_argv
from codesdk.worker.client import InvalidResult

from tests.worker.harness import REPO

_INIT = b'{"jsonrpc":"2.0","id":"i","method":"runtime.initialize","params":{"protocol_version":"1.0"}}'

#: (request line, the worker's exact answer, or None: no answer at all)
_EXCHANGES: list[tuple[bytes, bytes | None]] = [
    (b'{"jsonrpc":"2.0","id":1,"method":"runtime.stop","params":{"task_id":"t"}}',
     b'{"jsonrpc":"2.0","error":{"code":-32002,"message":"call runtime.initialize first"},"id":1}'),
    (b'{"jsonrpc":"2.0","id":2,"method":"runtime.nope"}',
     b'{"jsonrpc":"2.0","error":{"code":-32601,"message":"Method not found","data":"runtime.nope"},"id":2}'),
    (b'{"jsonrpc":"2.0","id":3,"method":"runtime.stop","params":["t1"]}',
     (b'{"jsonrpc":"2.0","error":{"code":-32602,"message":"Invalid params","data":"too many positional arguments"},'
     b'"id":3}')),
    (b'{"jsonrpc":"2.0","id":4,"method":"runtime.initialize","params":{"protocol_version":"2.0"}}',
     (b'{"jsonrpc":"2.0","error":{"code":-32003,"message":"protocol 2.0 is not supported; this worker speaks 1.0",'
     b'"data":{"supported":["1.0"]}},"id":4}')),
    (b'{"jsonrpc":"2.0","id":5,"method":"runtime.initialize","params":{"protocol_version":"1.0","x":1}}',
     (b'{"jsonrpc":"2.0","error":{"code":-32602,"message":"Invalid params","data":{"errors":[{"loc":"x",'
     b'"msg":"Extra inputs are not permitted","type":"extra_forbidden"}]}},"id":5}')),
    (_INIT, None),  # answered with the worker's pid: checked apart
    (b'{"jsonrpc":"2.0","id":6,"method":"runtime.stop","extra":1}',
     (b'{"jsonrpc":"2.0","error":{"code":-32600,"message":"Invalid request","data":"The request failed schema '
     b'validation"},"id":6}')),
    (b'{"jsonrpc":"2.0","id":7,"method":"runtime.stop","params":null}',
     (b'{"jsonrpc":"2.0","error":{"code":-32600,"message":"Invalid request","data":"The request failed schema '
     b'validation"},"id":7}')),
    (b'{"jsonrpc":"2.0","id":true,"method":"runtime.stop"}',
     (b'{"jsonrpc":"2.0","error":{"code":-32600,"message":"Invalid request","data":"The request failed schema '
     b'validation"},"id":null}')),
    (b'[{"jsonrpc":"2.0","id":8,"method":"runtime.stop"}]',
     (b'{"jsonrpc":"2.0","error":{"code":-32600,"message":"batch requests are not supported by this protocol; '
     b'send one object per line"},"id":null}')),
    (b'{"jsonrpc":"2.0","id":null,"method":"runtime.stop","params":{"task_id":"zz"}}',
     b'{"jsonrpc":"2.0","error":{"code":-32008,"message":"no active task \'zz\' in this worker"},"id":null}'),
    (b'{"jsonrpc":"2.0","id":1.5,"method":"runtime.stop","params":{"task_id":"zz"}}',
     b'{"jsonrpc":"2.0","error":{"code":-32008,"message":"no active task \'zz\' in this worker"},"id":1.5}'),
    ((b'{"jsonrpc":"2.0","id":9,"method":"runtime.startTask","params":{"runtime":"scripted","session":'
     b'{"session_id":""},"task_id":"t"}}'),
     (b'{"jsonrpc":"2.0","error":{"code":-32602,"message":"Invalid params","data":{"errors":[{"loc":'
     b'"session.session_id","msg":"String should have at least 1 character","type":"string_too_short"}]}},"id":9}')),
    ((b'{"jsonrpc":"2.0","id":10,"method":"runtime.startTask","params":{"runtime":"scripted","session":'
     b'{"session_id":"s"},"task_id":"t","runtime_config":{"scenario":"../x"}}}'),
     (b'{"jsonrpc":"2.0","error":{"code":-32011,"message":"invalid scenario name \'../x\': use letters, digits, '
     b'\'-\' and \'_\'","data":null},"id":10}')),
    # notifications: executed, never answered, not even with an error
    (b'{"jsonrpc":"2.0","method":"runtime.nope"}', None),
    (b'{"jsonrpc":"2.0","method":"runtime.stop","params":{"task_id":"nope"}}', None),
    ((b'{"jsonrpc":"2.0","method":"runtime.startTask","params":{"runtime":"scripted","session":{"session_id":"s"},'
     b'"task_id":"quiet","runtime_config":{"scenario":"hang"}}}'), None),
    (b'{"jsonrpc":"2.0","id":11,"method":"runtime.stop","params":{"task_id":"quiet","reason":"enough"}}',
     b'{"jsonrpc":"2.0","result":{"ok":true},"id":11}'),  # the notification did start the task
    (b'{"jsonrpc":"2.0","id":12,"method":"runtime.shutdown","params":{"x":1}}',
     (b'{"jsonrpc":"2.0","error":{"code":-32602,"message":"Invalid params","data":{"detail":"runtime.shutdown '
     b'takes no params"}},"id":12}')),
    (b'{"jsonrpc":"2.0","id":13,"method":"runtime.shutdown","params":[]}',
     b'{"jsonrpc":"2.0","result":{"ok":true},"id":13}'),
]


async def test_every_answer_is_the_one_jsonrpcserver_gave(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "CODESDK_SCENARIO_DIR": str(REPO / "worker" / "adapters" / "scripted" / "scenarios"), "CODESDK_SCRIPTED_TEST_STEPS": "1"}
    stdin = b"".join(line + b"\n" for line, _ in _EXCHANGES)
    with trio.fail_after(30):
        done = await trio.run_process(worker_argv(), stdin=stdin, capture_stdout=True, capture_stderr=True, env=env)
    lines = done.stdout.splitlines()
    answers = [line for line in lines if b'"method":"runtime.event"' not in line]
    initialized = json.loads(answers.pop(5))
    assert initialized["id"] == "i" and initialized["result"]["protocol_version"] == PROTOCOL_VERSION
    assert answers == [answer for _, answer in _EXCHANGES if answer is not None]
    events = [json.loads(line)["params"] for line in lines if b'"method":"runtime.event"' in line]
    assert {e["task_id"] for e in events} == {"quiet"}
    stopped = events[-1]["event"]["payload"]
    assert (stopped["reason"], stopped["requested_by"]) == ("enough", "supervisor")
    assert stopped["receipt"]["interrupt_sent"] and stopped["receipt"]["processes"] == []


async def test_typed_requests_return_their_result_models(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_worker(home=tmp_path) as worker:
            conn = worker.process.connection  # the supervisor's typed client itself, under the driver
            auth = await conn.request(Rpc.GET_AUTH_STATUS, GetAuthStatusParams(runtime="scripted"))
            assert isinstance(auth, AuthStatus) and auth.state == "not_required"
            started = await conn.request(Rpc.START_TASK, StartTaskParams.model_validate({
                "runtime": "scripted", "session": {"session_id": "s1"}, "task_id": "t1",
                "runtime_config": {"scenario": "hang"}}))
            assert isinstance(started, StartTaskResult) and started.task_id == "t1"
            assert (await conn.request(Rpc.STOP, StopParams(task_id="t1"))).ok
            with pytest.raises(RpcError) as err:
                await conn.request(Rpc.GET_AUTH_STATUS, GetAuthStatusParams(runtime="nope"))
            assert err.value.code == ErrorCode.UNKNOWN_RUNTIME and err.value.data == {"known": ["claude", "codex", "codex-acp", "gemini", "opencode", "scripted"]}
            with pytest.raises(TypeError):
                await conn.request(Rpc.STOP, GetAuthStatusParams(runtime="x"))  # type: ignore[arg-type]
            assert (await conn.request(Rpc.SHUTDOWN, NoParams())).ok
            assert (await worker.wait_exit()).exit_code == 0


async def test_a_result_its_model_refuses_is_an_invalid_result_and_a_violation() -> None:
    to_worker_send, to_worker_receive = trio.testing.memory_stream_one_way_pair()
    from_worker_send, from_worker_receive = trio.testing.memory_stream_one_way_pair()
    connection = WorkerConnection(to_worker_send, from_worker_receive, name="fake-worker")

    async def peer() -> None:
        reader = MessageReader()
        while True:
            for message in reader.feed(await to_worker_receive.receive_some()):
                assert isinstance(message, Request) and message.params is None  # no params member for shutdown
                await from_worker_send.send_all(encode_message(Response(id=message.id, result={"ok": "maybe"})))
                return

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(connection.run_reader)
            nursery.start_soon(peer)
            with pytest.raises(InvalidResult, match="runtime.shutdown"):
                await connection.request(Rpc.SHUTDOWN, NoParams())
            assert connection.stats.recent_violations[-1].kind == "invalid_result"
            await from_worker_send.aclose()
