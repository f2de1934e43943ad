"""Workers forked by the worker template (supervisor/workers/template.py, worker/template.py).

A forked worker is the namespace's worker in every way the pool relies on: the supervisor's child (it waits for
it, reads its exit), leader of its own session, in its home, with exactly its launch's environment and identity.
A template that dies costs speed only: the next worker starts the usual way.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from codesdk.testing.invariants import check_session
from codesdk.protocol import EventType, TaskFailed
from codesdk.supervisor.engine import Engine, session_events
from codesdk.supervisor.namespaces import NamespaceEnv, UidRange
from codesdk.supervisor.store import TaskState
from codesdk.worker.client import WorkerProcess

from tests.conftest import MakeEngine
from tests.reliability.probe_worker import interpreter_for_any_uid, why_no_worker_uids, worker_argv_for_any_uid
from tests.e2e.conftest import run_task, wait_for_event, worker_of

#: Run by the scripted runtime as its "runtime process": what a worker's child inherits from the worker.
REPORT = ("import json, os, sys\n"
          "json.dump({'env': dict(os.environ), 'uid': os.getuid(), 'gid': os.getgid(), 'groups': os.getgroups()},"
          " open(sys.argv[1], 'w'))\n")
UIDS = UidRange(3_910_000, 4)


def _forked(worker: WorkerProcess) -> bool:
    """Forked by the template: its command line is the template's (a spawned worker's has no --template)."""
    return "--template" in psutil.Process(worker.pid).cmdline()


def _template_pid() -> int:
    [template] = [child for child in psutil.Process().children()
                  if "--template" in child.cmdline() and os.getsid(child.pid) == child.pid
                  and child.ppid() == os.getpid() and not _is_worker(child)]
    return template.pid


def _is_worker(process: psutil.Process) -> bool:
    """A forked worker shares the template's command line but not its directory (each works in its home)."""
    return process.cwd() != "/"


async def _template_ready(engine: Engine) -> None:
    """Wait until the template (started in the background with the pool) is ready to fork."""
    while (state := engine.pool.template_state()) != "ready":
        assert state == "starting", state
        await trio.sleep(0.01)


async def _report(engine: Engine, namespace: str, out: Path, python: str = sys.executable) -> dict[str, Any]:
    _, record, _ = await run_task(engine, namespace=namespace, runtime_config={"scenario_inline": {
        "name": "report", "steps": [{"runtime_process": [python, "-c", REPORT, str(out)]},
                                    {"complete": {}}]}})
    assert record.state == TaskState.COMPLETED, record.error
    report: dict[str, Any] = json.loads(out.read_text())
    return report


async def test_a_forked_worker_is_the_namespaces_worker(make_engine: MakeEngine, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODESDK_TEST_CANARY", "the supervisor's own")
    NamespaceEnv(tmp_path / "data").update("user:alice", {"ALICE_ONLY": "alice's secret"})
    with trio.fail_after(120):
        async with make_engine(worker_template=True) as engine:
            await _template_ready(engine)
            alice = await _report(engine, "user:alice", tmp_path / "alice.json")
            bob = await _report(engine, "user:bob", tmp_path / "bob.json")
            for namespace, report in (("user:alice", alice), ("user:bob", bob)):
                worker = worker_of(engine, namespace)
                process = psutil.Process(worker.pid)
                assert _forked(worker)
                assert process.ppid() == os.getpid()  # ours to reap, not the template's
                assert os.getsid(worker.pid) == worker.pid
                assert process.cwd() == report["env"]["HOME"]
                assert report["env"]["HOME"].endswith("/namespaces/" + namespace.replace(":", ".") + "/home")
                assert "CODESDK_TEST_CANARY" not in report["env"]
                assert (report["uid"], report["gid"]) == (os.getuid(), os.getgid())
            assert alice["env"]["ALICE_ONLY"] == "alice's secret"
            assert "ALICE_ONLY" not in bob["env"]
            assert set(alice["env"]) - {"ALICE_ONLY"} == set(bob["env"])


async def test_a_killed_forked_worker_fails_its_task_once_and_is_replaced(make_engine: MakeEngine) -> None:
    with trio.fail_after(120):
        async with make_engine(worker_template=True) as engine:
            await _template_ready(engine)
            session = await engine.create_session()
            task = await engine.start_task(session.session_id, "x", runtime_config={"scenario": "hang"})
            await wait_for_event(EventType.MODEL_OUTPUT_COMPLETED, engine, session.session_id)
            worker = worker_of(engine)
            assert _forked(worker)
            os.kill(worker.pid, signal.SIGKILL)
            record = await engine.wait_task(task.task_id)
            events = await session_events(engine.store, session.session_id)
            check_session(events)
            [failed] = [e.payload for e in events if e.type == EventType.TASK_FAILED]
            assert isinstance(failed, TaskFailed)
            assert record.state == TaskState.FAILED and failed.code == "WORKER_CRASHED"
            assert failed.details["signal"] == "SIGKILL" and failed.details["worker_pid"] == worker.pid
            _, again, _ = await run_task(engine, session_id=session.session_id, runtime_config={"scenario": "echo"})
            assert again.state == TaskState.COMPLETED and again.worker_pid != worker.pid
            assert _forked(worker_of(engine))


async def test_a_dead_template_costs_only_speed(make_engine: MakeEngine, tmp_path: Path) -> None:
    with trio.fail_after(120):
        async with make_engine(worker_template=True) as engine:
            await _template_ready(engine)
            await _report(engine, "user:alice", tmp_path / "alice.json")
            alice = worker_of(engine, "user:alice")
            template = _template_pid()
            os.kill(template, signal.SIGKILL)
            await _report(engine, "user:bob", tmp_path / "bob.json")  # started the usual way meanwhile
            assert not _forked(worker_of(engine, "user:bob"))
            assert engine.pool.template_state().startswith("down: it exited (killed by signal SIGKILL")
            assert engine.pool.status()[1]["started_by"] == "new interpreter"
            await _report(engine, "user:alice", tmp_path / "alice2.json")  # its forked worker is unaffected
            assert worker_of(engine, "user:alice") is alice


@pytest.mark.skipif(why_no_worker_uids() is not None, reason=why_no_worker_uids() or "")
@pytest.mark.parametrize("template", [True, False], ids=["forked", "spawned"])
async def test_workers_run_as_their_namespaces_uid_without_groups_in_their_default_workspace(
        make_engine: MakeEngine, open_tmp: Path, template: bool) -> None:
    """Also the default workspace of a session made before its namespace's worker started stays reachable to it
    (the worker's start once closed ``workspaces/`` again)."""
    argv, python = worker_argv_for_any_uid(), interpreter_for_any_uid()
    assert argv is not None and python is not None
    out = open_tmp / "out"
    out.mkdir()
    os.chmod(out, 0o1733)
    with trio.fail_after(120):
        async with make_engine(worker_template=template, worker_uids=UIDS, worker_argv=tuple(argv),
                               data_dir=open_tmp / "data") as engine:
            if template:
                await _template_ready(engine)
            reports = {ns: await _report(engine, ns, out / f"{ns.replace(':', '.')}.json", python[0])
                       for ns in ("user:alice", "user:bob")}
            uids = set()
            for namespace, report in reports.items():
                worker = worker_of(engine, namespace)
                assert _forked(worker) == template
                process = psutil.Process(worker.pid)
                assert process.uids().real == process.uids().effective == process.uids().saved == report["uid"]
                assert process.gids().real == report["gid"] and report["groups"] == []
                assert report["uid"] in range(UIDS.start, UIDS.start + UIDS.count)
                uids.add(report["uid"])
                home = Path(report["env"]["HOME"])
                other = "user.bob" if namespace == "user:alice" else "user.alice"
                assert home.parent.name == namespace.replace(":", ".")
                assert (home.parent.parent / other).exists()
            assert len(uids) == 2


#: A worker program whose template mode fails (exit 3) or never gets ready (sleeps), and which works as a worker.
BROKEN_TEMPLATE = ("import sys, time\n"
                   "if '--template' in sys.argv:\n"
                   "    time.sleep(3600) if sys.argv[1] == 'stall' else sys.exit(3)\n"
                   "from codesdk.worker.main import main\n"
                   "sys.exit(main(sys.argv[2:]))\n")


@pytest.mark.parametrize("how", ["exit", "stall"])
async def test_a_template_that_never_gets_ready_costs_only_speed(make_engine: MakeEngine, tmp_path: Path,
                                                               how: str) -> None:
    """Workers start the usual way meanwhile, tasks in every namespace run, and the engine closes cleanly."""
    with trio.fail_after(120):
        async with make_engine(worker_template=True,
                               worker_argv=(sys.executable, "-c", BROKEN_TEMPLATE, how)) as engine:
            if how == "exit":
                while engine.pool.template_state() == "starting":
                    await trio.sleep(0.01)
                assert engine.pool.template_state() == "down: it ended before it was ready"
            for namespace in ("user:alice", "user:bob"):
                await _report(engine, namespace, tmp_path / f"{namespace}.json")
            assert {w["started_by"] for w in engine.pool.status()} == {"new interpreter"}
