"""Frozen corpora of stored events: what a build of each event schema version wrote, kept to prove later builds
still read it (``tests/store/test_stored_versions.py``).

``fixtures/stored_events/v<N>/`` holds the rows of the ``events`` table exactly as a build at schema version N
stored them, one row a line in ``events.jsonl`` (the columns by name; ``body`` is the stored JSON text, verbatim),
with ``manifest.json`` (what produced them, at which store schema, counts per type) and a README. Never edit one:
a corpus is evidence of what is on users' disks.

Freezing the corpus of the current version (refuses to overwrite one)::

    scripts/freeze-stored-events            # -> fixtures/stored_events/v<SCHEMA_VERSION>/
    .venv/bin/python -m tests.store.stored_events --out DIR

It runs real tasks of the scripted runtime through the engine (worker processes, tools, approvals, a crash, a
stop) into a fresh data dir, and copies the rows out of its SQLite database.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any

import apsw
import trio

from codesdk.testing.invariants import InvariantError, check_session
from codesdk.protocol import (
    SCHEMA_VERSION,
    EventType,
    GrantScope,
    InteractionMode,
    NormalizedEvent,
    PermissionMode,
    TraceContext,
    upcasters,
)
from codesdk.supervisor.store import DB_FILENAME

REPO = Path(__file__).resolve().parents[2]
CORPUS_ROOT = REPO / "fixtures" / "stored_events"
EVENTS_FILE = "events.jsonl"
MANIFEST_FILE = "manifest.json"
README_FILE = "README.md"


# --- reading a corpus -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    """One frozen corpus: its rows (column -> value, as the ``events`` table held them) and its manifest."""

    path: Path
    version: int
    manifest: Mapping[str, Any]
    rows: tuple[Mapping[str, Any], ...]

    @property
    def store_schema_version(self) -> int:
        """The database schema (``PRAGMA user_version``) the rows were stored under."""
        return int(self.manifest["store_schema_version"])

    def sessions(self) -> dict[str, list[Mapping[str, Any]]]:
        """Rows by session, in the order they were stored."""
        by_session: dict[str, list[Mapping[str, Any]]] = {}
        for row in self.rows:
            by_session.setdefault(str(row["session_id"]), []).append(row)
        return by_session


def corpus_versions(root: Path = CORPUS_ROOT) -> list[int]:
    """The schema versions with a frozen corpus under ``root``."""
    return sorted(int(p.name[1:]) for p in root.iterdir() if p.is_dir() and p.name[:1] == "v" and p.name[1:].isdigit())


def read_corpus(version: int, root: Path = CORPUS_ROOT) -> Corpus:
    path = root / f"v{version}"
    manifest = json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8"))
    with (path / EVENTS_FILE).open(encoding="utf-8") as lines:
        rows = tuple(json.loads(line) for line in lines)
    return Corpus(path=path, version=version, manifest=manifest, rows=rows)


# --- freezing the current version -----------------------------------------------------------------------------

#: The README written beside every corpus.
README = """\
# Stored events at schema version {version}

Rows of the event store's `events` table exactly as a CodeSDK build at event schema version {version}
(`protocol.SCHEMA_VERSION`) stored them: one row a line in `{events}`, its columns by name; `body` is the
stored JSON text itself, verbatim (the event without `seq`, which is the row's key). `{manifest}` says
what produced them, under which database schema (`store_schema_version`, the store's `PRAGMA user_version`)
they were stored, and how many there are of each event type.

{sessions} sessions, {count} events, of every event type there was at version {version}:

{types}

Ids, times and paths are those of the run. Blobs the events name (`input_ref`, `result_ref`, `raw_ref` …) are
not kept: this is a corpus of events.

Produced once by `scripts/freeze-stored-events` (`python -m tests.store.stored_events`), which ran real tasks
of the scripted runtime through the engine — worker processes, supervisor tools (reads, a write, commands
with their output, a large input kept as a blob, failing calls, a replayed call), a runtime's own tool,
approvals answered in-process, over the API (durable) and refused by policy, a runtime's failure, a worker
crash, a refused scenario, a stopped task — and copied the rows out of its SQLite database.

`tests/store/test_stored_versions.py` writes these rows into a database as that build left it, opens it
with this build's store and checks every event loads (upcast where older) and keeps the invariants of
`codesdk.testing.invariants.check_session`.

**The rule: never edit these files.** They are evidence of what is on users' disks. When the event schema
changes so that a stored event would no longer validate: bump `SCHEMA_VERSION` (protocol/_versions.py),
register an upcaster from the old version in `protocol.upcasters` (protocol/_events.py), and freeze a new
corpus with `scripts/freeze-stored-events` (it writes `v<SCHEMA_VERSION>/` and refuses to overwrite one).
"""


class FreezeError(RuntimeError):
    """The corpus could not be produced as required (nothing was written to the target)."""


#: The scripted scenario of the "tools" session, written beside the fixtures' scenarios (as a file, not inline: its
#: large input would otherwise be stored again in task.started's runtime_config).
TOOLS_SCENARIO: dict[str, Any] = {"name": "corpus-tools", "steps": [
    {"tool_calls": [{"id": "exec_ok", "name": "workspace.exec",
                     "input": {"argv": ["sh", "-c", "echo to stdout; echo to stderr >&2"]}}]},
    {"tool_calls": [{"id": "exec_fail", "name": "workspace.exec",  # no on_error: the scenario goes on
                     "input": {"argv": ["sh", "-c", "echo failing >&2; exit 3"]}}]},
    {"tool_calls": [{"id": "read_missing", "name": "workspace.read", "input": {"path": "missing.txt"}}]},
    {"tool_calls": [{"id": "write_big", "name": "workspace.write",  # over the inline limit: stored as input_ref
                     "input": {"path": "big.txt", "content": "x" * (20 * 1024) + "\n"}}]},
    {"tool_calls": [{"id": "runtime_tool", "name": "Read", "input": {"file_path": "README.md"},
                     "executed_by": "runtime"}]},
    {"text": "done: {{result:runtime_tool}}"},
    {"usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_tokens": 3, "reasoning_tokens": 2}},
    {"complete": {"stop_reason": "end_turn"}}]}


async def _run_tasks(data_dir: Path, workspaces: Path, scenarios: Path) -> None:
    """Real tasks through the engine, so that every event type is stored at least once."""
    # Imported here: reading a corpus (what the tests do) needs none of the engine.
    from codesdk.supervisor.service.assembly import SupervisorOptions, open_engine
    from codesdk.supervisor.engine import ApprovalRequest, ApproverAnswer, Engine

    async def until(engine: Engine, session_id: str, event_type: EventType) -> Any:
        async with engine.store.subscribe(session_id) as events:
            async for event in events:
                if event.type == event_type:
                    return event.payload
        raise FreezeError(f"session {session_id} ended before a {event_type}")

    async def session(engine: Engine, name: str, files: Mapping[str, str] | None = None) -> str:
        workspace = workspaces / name
        workspace.mkdir()
        for file, text in (files or {}).items():
            (workspace / file).write_text(text)
        return (await engine.create_session(workspace=workspace, metadata={"corpus": name})).session_id

    async def task(engine: Engine, session_id: str, prompt: str, scenario: str, **options: Any) -> str:
        started = await engine.start_task(session_id, prompt, runtime_config={"scenario": scenario}, **options)
        await engine.wait_task(started.task_id)
        return started.task_id

    async def approve(request: ApprovalRequest) -> ApproverAnswer:
        return ApproverAnswer(allow=True, reason="fine by the corpus")

    async def for_the_session(request: ApprovalRequest) -> ApproverAnswer:
        return ApproverAnswer(allow=True, reason="for the session", scope=GrantScope.SESSION)

    async def refuse(request: ApprovalRequest) -> ApproverAnswer:
        return ApproverAnswer(allow=False, reason="not in the corpus")

    interactive: dict[str, Any] = {"permission_mode": PermissionMode.ASK,
                                   "interaction_mode": InteractionMode.INTERACTIVE}
    options = SupervisorOptions(data_dir=data_dir, worker_env={"*": {"CODESDK_SCENARIO_DIR": str(scenarios)}},
                                test_scenarios=True, exec_allowlist=("sh",), holder="freeze-stored-events")
    async with open_engine(options) as engine:
        # A conversation: plain output (traced as an API request is), then parallel reads (thinking, text, code
        # blocks), then the same reads again in a later task of the session (replayed from the store).
        chat = await session(engine, "conversation", {"a.txt": "alpha\n", "b.txt": "beta\n"})
        await task(engine, chat, "hello", "echo",
                   trace=TraceContext(request_id="req-corpus-1", client_id="corpus-client", user_id="corpus-user"))
        await task(engine, chat, "read both", "parallel-tools", permission_mode=PermissionMode.AUTO)
        await task(engine, chat, "read both again", "parallel-tools", permission_mode=PermissionMode.AUTO)
        # Approvals: a human allows, a human refuses, policy refuses (nobody to ask), decided over the API.
        await task(engine, await session(engine, "approved"), "write", "write-or-deny", approver=approve,
                   **interactive)
        await task(engine, await session(engine, "refused"), "write", "write-or-deny", approver=refuse,
                   **interactive)
        await task(engine, await session(engine, "policy-denied"), "write", "write-or-deny",
                   permission_mode=PermissionMode.ASK)
        # A grant: one answer for the session decides the second write unasked; then it is revoked.
        granted = await session(engine, "granted")
        await task(engine, granted, "write twice", "write-twice", approver=for_the_session, **interactive)
        record = await engine.store.get_session(granted)
        for entry in await engine.grants.entries(record):
            await engine.grants.revoke(record, entry.created.grant_id, "freeze-stored-events")
        durable = await session(engine, "durable-approval")
        started = await engine.start_task(durable, "write", runtime_config={"scenario": "write-or-deny"},
                                          permission_mode=PermissionMode.ASK, durable_approvals=True)
        asked = await until(engine, durable, EventType.APPROVAL_REQUESTED)
        await engine.approvals.decide(asked.approval_id, True, "api:freeze-stored-events", "approved over the API")
        await engine.wait_task(started.task_id)
        # Tools of every kind: a command with stdout and stderr, a failing command, a failing read, a large input
        # (kept as a blob, input_ref), a tool the runtime runs itself.
        await task(engine, await session(engine, "tools", {"README.md": "# Demo\n"}), "tools", "corpus-tools",
                   permission_mode=PermissionMode.YOLO)
        # Failures: the runtime's own, a worker crash, a scenario the runtime refuses.
        await task(engine, await session(engine, "runtime-failed"), "fail", "fail")
        await task(engine, await session(engine, "worker-crashed"), "crash", "crash-exit")
        await task(engine, await session(engine, "refused-scenario"), "nothing", "no-such-scenario")
        # Steering: an input sent while the task runs, delivered into its turn.
        steered = await session(engine, "steered")
        started = await engine.start_task(steered, "steer", runtime_config={"scenario": "steer"})
        await until(engine, steered, EventType.RUNTIME_REQUEST_COMPLETED)
        await engine.send_input(started.task_id, "and this too", input_id="corpus-input")
        await engine.wait_task(started.task_id)
        # A task stopped while its runtime hangs.
        hung = await session(engine, "stopped")
        started = await engine.start_task(hung, "hang", runtime_config={"scenario": "hang"})
        await until(engine, hung, EventType.MODEL_OUTPUT_COMPLETED)
        await engine.stop_task(started.task_id, reason="stopped by the corpus")
        await engine.wait_task(started.task_id)


def _rows(db_path: Path) -> tuple[int, list[dict[str, Any]]]:
    """The database's schema version and its ``events`` rows, session by session (in creation order), by seq."""
    conn = apsw.Connection(str(db_path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        store_schema = int(conn.pragma("user_version"))
        cursor = conn.execute("SELECT e.* FROM events e JOIN sessions s USING (session_id) ORDER BY s.rowid, e.seq")
        names = [column for column, _ in cursor.get_description()]
        return store_schema, [dict(zip(names, row, strict=True)) for row in cursor]
    finally:
        conn.close()


def _check(rows: list[dict[str, Any]]) -> Counter[str]:
    counts = Counter(str(row["type"]) for row in rows)
    if missing := sorted(set(EventType) - set(counts)):
        raise FreezeError(f"no stored event of type {', '.join(missing)}: make _run_tasks produce one")
    if old := sorted({row["schema_version"] for row in rows} - {SCHEMA_VERSION}):
        raise FreezeError(f"rows of schema version {old} in a fresh store of version {SCHEMA_VERSION}")
    by_session: dict[str, list[NormalizedEvent]] = {}
    for row in rows:
        event = upcasters.load({**json.loads(row["body"]), "seq": row["seq"]})
        by_session.setdefault(str(row["session_id"]), []).append(event)
    for session_id, events in by_session.items():
        try:
            check_session(events)
        except InvariantError as exc:
            raise FreezeError(f"session {session_id} breaks the event invariants: {exc}") from exc
    return counts


def freeze(target: Path) -> Path:
    """Write the corpus of the current schema version to ``target`` (which must not exist); return it."""
    if target.exists():
        raise FreezeError(f"{target} exists; a frozen corpus is never overwritten (pick another --out)")
    with tempfile.TemporaryDirectory(prefix="codesdk-freeze-") as scratch:
        root = Path(scratch)
        (root / "ws").mkdir()
        shutil.copytree(REPO / "worker" / "adapters" / "scripted" / "scenarios", root / "scenarios")
        (root / "scenarios" / "corpus-tools.json").write_text(json.dumps(TOOLS_SCENARIO), encoding="utf-8")
        trio.run(_run_tasks, root / "data", root / "ws", root / "scenarios")
        store_schema, rows = _rows(root / "data" / DB_FILENAME)
    counts = _check(rows)
    sessions = len({row["session_id"] for row in rows})
    event_types = {str(t): counts[str(t)] for t in EventType}
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "store_schema_version": store_schema,
        "codesdk_version": installed_version("codesdk"),
        "produced_by": "scripts/freeze-stored-events",
        "produced_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "sessions": sessions,
        "events": len(rows),
        "event_types": event_types,
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:  # written beside the target and renamed into place: never half a corpus
        with (partial / EVENTS_FILE).open("w", encoding="utf-8") as out:
            for row in rows:
                out.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
        (partial / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        (partial / README_FILE).write_text(README.format(
            version=SCHEMA_VERSION, events=EVENTS_FILE, manifest=MANIFEST_FILE, sessions=sessions, count=len(rows),
            types="\n".join(f"- `{t}`: {n}" for t, n in event_types.items())), encoding="utf-8")
        partial.chmod(0o755)
        if target.exists():  # made meanwhile
            raise FreezeError(f"{target} appeared while the corpus was produced; it is left as it is")
        partial.rename(target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="freeze-stored-events", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=CORPUS_ROOT / f"v{SCHEMA_VERSION}",
                        help="the new corpus directory (default: fixtures/stored_events/v<SCHEMA_VERSION>)")
    args = parser.parse_args(argv)
    try:
        target = freeze(args.out.resolve())
    except FreezeError as exc:
        print(f"freeze-stored-events: {exc}", file=sys.stderr)
        return 1
    manifest = json.loads((target / MANIFEST_FILE).read_text(encoding="utf-8"))
    print(f"{target}: schema version {manifest['schema_version']}, {manifest['sessions']} sessions, "
          f"{manifest['events']} events")
    for event_type, count in manifest["event_types"].items():
        print(f"  {event_type:<28} {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
