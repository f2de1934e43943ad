"""Tenant isolation with real workers: what one namespace's worker can see of another's, and whether any secret
(the supervisor's environment, a namespace's configured variables, API tokens, login files) reaches any output.

One engine run serves the whole module: two namespaces whose workers are started through a probe
(``probe_worker.py``) that records what the process can see and then becomes the real worker. Tasks of every
kind run in both (plain, failing, crashing, tool calls incl. sandboxed ``env``, auth status); every output is
collected and grepped for canary values afterwards.

As root the run uses a worker uid range (``SupervisorOptions.worker_uids``), so each namespace's worker has
its own uid and the probe's reads of a neighbour's home, the store, the token files and the supervisor's
/proc environ are really attempted and refused by the kernel (EACCES). Without root those tests are skipped.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from codesdk.protocol import EventType, PermissionMode
from codesdk.supervisor.api import TokenAuth
from codesdk.supervisor.cli.front import main as cli_main
from codesdk.supervisor.engine import Engine, EngineError, session_events
from codesdk.supervisor.namespaces import (
    ENV_DIR,
    SUBDIRS,
    UIDS_FILE,
    InvalidNamespace,
    Namespace,
    NamespaceEnv,
    UidRange,
    prepare_dirs,
)
from codesdk.supervisor.service.assembly import SupervisorOptions, open_engine
from codesdk.supervisor.store import DB_FILENAME
from codesdk.supervisor.workers.launch import WorkerPolicy
from codesdk.testing.invariants import check_session
from codesdk.worker.adapters.claude import home as claude_env
from codesdk.worker.client import WorkerProcess, worker_argv
from codesdk.worker.command import TEST_STEPS_ENV
from tests.reliability.probe_worker import (
    interpreter_for_any_uid,
    why_no_worker_uids,
    worker_argv_for_any_uid,
)
from tests.worker.harness import REPO

PROBE = Path(__file__).with_name("probe_worker.py")
ALICE, BOB = "user:alice", "user:bob"
_RUN = uuid.uuid4().hex[:12]
#: Secrets of the supervisor's own process environment.
SUPERVISOR_SECRETS = {
    "ANTHROPIC_API_KEY": f"canary-sup-anthropic-{_RUN}",
    "AWS_SECRET_ACCESS_KEY": f"canary-sup-aws-{_RUN}",
    "GITHUB_TOKEN": f"canary-sup-github-{_RUN}",
}
#: Variables the operator stored for Bob's namespace only (`codesdk-supervisor namespace env set`).
BOB_ENV = {"ANTHROPIC_API_KEY": f"canary-bob-anthropic-{_RUN}", "BOB_DB_PASSWORD": f"canary-bob-db-{_RUN}"}
BOB_FILE_SECRET = f"canary-bob-file-{_RUN}"
ALICE_OAUTH_SECRET = f"canary-alice-oauth-{_RUN}"
ALICE_EMAIL_USER = f"canary-alice-mail-{_RUN}"
#: Worker variables the pool adds for every namespace (plus the namespace's own directories).
COMMON_ENV = {"CODESDK_SCENARIO_DIR": str(REPO / "worker" / "adapters" / "scripted" / "scenarios"), "CODESDK_LOG_LEVEL": "DEBUG"}
BASE_NAMES = {"HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "TMPDIR", "PATH",
              "LANG", "LC_ALL"}
#: uids reserved for this module's workers (no passwd entries needed; any with one are skipped).
WORKER_UIDS = UidRange(3_900_000, 8)
#: What the probe tries to read in a neighbour's home and in the data dir, where it can't list anything.
PEEK = {"namespaces": ["user.alice", "user.bob"],
        "home_files": ["secret.txt", ".claude/.credentials.json", ".claude.json"],
        "data_files": ["admin.token", "api-tokens.json", UIDS_FILE, DB_FILENAME, f"{DB_FILENAME}-wal", "blobs"]}


@dataclass
class TenancyRun:
    """Everything the module's engine run produced, for the tests to inspect."""

    data_dir: Path
    uids: UidRange | None = None  # the worker uid range the run used, if any
    findings: dict[str, dict[str, Any]] = field(default_factory=dict)  # namespace -> probe findings
    outputs: dict[str, str] = field(default_factory=dict)  # label -> text some user or log could see
    api_tokens: list[str] = field(default_factory=list)
    auth: dict[str, dict[str, Any]] = field(default_factory=dict)
    fds: dict[str, dict[str, str]] = field(default_factory=dict)  # namespace -> fd -> target (running worker)
    stdio: dict[str, set[str]] = field(default_factory=dict)  # namespace -> pipe objects the supervisor holds
    supervisor_fds: set[str] = field(default_factory=set)

    def secrets(self) -> dict[str, str]:
        named = {f"supervisor {k}": v for k, v in SUPERVISOR_SECRETS.items()}
        named |= {f"bob's {k}": v for k, v in BOB_ENV.items()}
        named |= {"bob's home file": BOB_FILE_SECRET, "alice's OAuth file": ALICE_OAUTH_SECRET,
                  "alice's e-mail": ALICE_EMAIL_USER}
        named |= {f"API token {n}": token for n, token in enumerate(self.api_tokens)}
        return named


def _fd_targets(pid: int | str) -> dict[str, str]:
    found = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            found[name] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
    return found


def _stdio_objects(worker: WorkerProcess) -> set[str]:
    streams = (worker.process.stdin, worker.process.stdout, worker.process.stderr)
    return {os.readlink(f"/proc/self/fd/{stream.fileno()}") for stream in streams}  # type: ignore[union-attr]


def _plant_secrets(data_dir: Path) -> list[str]:
    """Bob's home holds a secret file; Alice's holds a Claude OAuth login; the data dir holds API tokens."""
    bob = prepare_dirs(data_dir, Namespace.parse(BOB))
    (bob.home / "secret.txt").write_text(BOB_FILE_SECRET)
    alice = prepare_dirs(data_dir, Namespace.parse(ALICE))
    (alice.home / ".claude").mkdir(mode=0o700)
    (alice.home / ".claude" / ".credentials.json").write_text(json.dumps(
        {"claudeAiOauth": {"accessToken": ALICE_OAUTH_SECRET, "refreshToken": ALICE_OAUTH_SECRET}}))
    (alice.home / ".claude.json").write_text(json.dumps(
        {"oauthAccount": {"emailAddress": f"{ALICE_EMAIL_USER}@example.com"}}))
    auth = TokenAuth.bootstrap(data_dir)
    admin = (data_dir / "admin.token").read_text().strip()
    return [admin, auth.add_principal("bob", [BOB])]


async def _run(engine: Engine, namespace: str, workspace: Path, scenario: Any,
               mode: PermissionMode = PermissionMode.YOLO) -> str:
    session = await engine.create_session(namespace=namespace, workspace=workspace)
    config = {"scenario_inline": scenario} if isinstance(scenario, dict) else {"scenario": scenario}
    task = await engine.start_task(session.session_id, "hello", runtime_config=config, permission_mode=mode)
    await engine.wait_task(task.task_id)
    return session.session_id


def _probe_tools_scenario(bob_secret_path: Path) -> dict[str, Any]:
    """Alice's runtime asks the supervisor for Bob's file (refused) and for its sandbox environment."""
    return {"name": "peek", "steps": [
        {"tool_calls": [
            {"id": "abs", "name": "workspace.read", "input": {"path": str(bob_secret_path)}},
            {"id": "rel", "name": "workspace.read", "input": {"path": "../data/namespaces/user.bob/home/secret.txt"}},
            {"id": "env", "name": "workspace.exec", "input": {"argv": ["env"]}},
        ]},
        {"text": "abs={{result:abs}} rel={{result:rel}} env={{result:env}}"},
        {"complete": {}},
    ]}


async def _scenario(run: TenancyRun, tmp: Path) -> None:
    data_dir = run.data_dir
    run.api_tokens = _plant_secrets(data_dir)
    probe_out = tmp / "probe"
    probe_out.mkdir()
    python, worker_cmd = [sys.executable], worker_argv()
    if run.uids is not None:  # the probe runs as the worker's uid: it may add its findings, not list them
        os.chmod(probe_out, 0o1733)
        python, worker_cmd = interpreter_for_any_uid() or [], worker_argv_for_any_uid() or []
    options = SupervisorOptions(
        data_dir=data_dir, exec_allowlist=("env",), worker_policy=WorkerPolicy(idle_timeout_s=60),
        worker_argv=(*python, str(PROBE), str(probe_out), json.dumps(PEEK), *worker_cmd),
        worker_env={"*": COMMON_ENV}, worker_uids=run.uids, test_scenarios=True)
    NamespaceEnv(data_dir).update(BOB, BOB_ENV)
    workspaces = {ns: tmp / f"ws-{ns.split(':')[1]}" for ns in (ALICE, BOB)}
    for ws in workspaces.values():
        ws.mkdir()
    sessions: list[str] = []
    with trio.fail_after(60):
        async with open_engine(options) as engine:
            for ns in (ALICE, BOB):
                sessions.append(await _run(engine, ns, workspaces[ns], "echo"))
                sessions.append(await _run(engine, ns, workspaces[ns], "fail"))
                for runtime in ("claude", "no-such-runtime"):
                    try:
                        run.auth[f"{ns}/{runtime}"] = (await engine.ensure_login(ns, runtime)).to_json_obj()
                    except EngineError as exc:
                        run.outputs[f"{ns} ensure_login({runtime}) error"] = str(exc)
            sessions.append(await _run(engine, ALICE, workspaces[ALICE],
                                       _probe_tools_scenario(data_dir / "namespaces" / "user.bob" / "home" /
                                                             "secret.txt")))
            run.supervisor_fds = set(_fd_targets("self").values())
            for ns in (ALICE, BOB):
                worker = engine.pool.worker_of(ns)
                assert worker is not None
                run.fds[ns] = _fd_targets(worker.pid)
                run.stdio[ns] = _stdio_objects(worker)
                run.outputs[f"{ns} worker stderr"] = worker.stderr.text()
            sessions.append(await _run(engine, BOB, workspaces[BOB], "crash-exit"))
            run.outputs["pool status"] = json.dumps(engine.pool.status())
            for session_id in sessions:
                events = await session_events(engine.store, session_id)
                check_session(events)
                run.outputs[f"events of {session_id}"] = json.dumps([e.to_json_obj() for e in events])
                if any(e.type == EventType.TASK_FAILED and e.payload.code == "WORKER_CRASHED"  # type: ignore[attr-defined]
                       for e in events):
                    run.outputs["crash seen"] = "yes"
    for path in sorted(probe_out.glob("*.json")):
        run.findings[path.stem] = json.loads(path.read_text())
    for path in sorted(data_dir.rglob("*")):  # raw bytes: the store's database/WAL, blobs, token files ...
        parts = path.relative_to(data_dir).parts  # where secrets belong: homes, stored variables, the admin token
        if path.is_file() and not {"namespaces", ENV_DIR} & set(parts) and path.name != "admin.token":
            run.outputs[f"file {path.relative_to(data_dir)}"] = path.read_bytes().decode("latin-1")


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(logging.Formatter("%(name)s %(levelname)s %(message)s").format(record))


@pytest.fixture(scope="module")
def tenancy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenancyRun]:
    uids = None if why_no_worker_uids() else WORKER_UIDS
    if uids is None:
        tmp = tmp_path_factory.mktemp("tenancy")
    else:  # pytest's base temp dir is 0700: workers of other uids could not even reach their own homes
        tmp = Path(tempfile.mkdtemp(prefix="codesdk-tenancy-"))
        os.chmod(tmp, 0o711)
    run = TenancyRun(data_dir=tmp / "data", uids=uids)
    handler, root = _Collect(), logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        with pytest.MonkeyPatch.context() as patch:
            for name, value in SUPERVISOR_SECRETS.items():
                patch.setenv(name, value)
            trio.run(_scenario, run, tmp)
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    run.outputs["supervisor log"] = "\n".join(handler.lines)
    try:
        yield run
    finally:
        if uids is not None:
            shutil.rmtree(tmp, ignore_errors=True)


# --- environment and directories -------------------------------------------------------------------


def test_each_worker_environment_is_built_from_scratch(tenancy: TenancyRun) -> None:
    """A worker gets its namespace's paths and configured variables, never the supervisor's or a neighbour's."""
    for ns, extra in ((ALICE, {}), (BOB, BOB_ENV)):
        root = str(tenancy.data_dir.resolve() / "namespaces" / Namespace.parse(ns).safe_name)
        env = tenancy.findings[Namespace.parse(ns).safe_name]["env"]
        assert set(env) == BASE_NAMES | set(COMMON_ENV) | set(extra) | {TEST_STEPS_ENV}, ns
        assert {k: env[k] for k in extra} == extra
        for name in ("HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "TMPDIR"):
            assert str(Path(env[name]).resolve()).startswith(root + "/"), (ns, name, env[name])
    alice_env = json.dumps(tenancy.findings["user.alice"]["env"])
    for secret in (*SUPERVISOR_SECRETS.values(), *BOB_ENV.values()):
        assert secret not in alice_env


def test_stored_variables_are_private_files_of_the_supervisor(tenancy: TenancyRun) -> None:
    stored = tenancy.data_dir / ENV_DIR
    assert stat.S_IMODE(stored.stat().st_mode) == 0o700 and stored.stat().st_uid == os.getuid()
    files = [p for p in stored.iterdir()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    listing = json.dumps([e.to_json_obj() for e in NamespaceEnv(tenancy.data_dir).entries(BOB)])
    assert sorted(BOB_ENV) == [e["name"] for e in json.loads(listing)]
    assert not [secret for secret in BOB_ENV.values() if secret in listing]


def test_namespace_directories_are_private_and_workers_start_in_their_own_home(tenancy: TenancyRun) -> None:
    """0700 everywhere, owned by the namespace's worker uid when there is one; the data dir and namespaces/
    are then 0711 (passable to one's own home, not listable) and everything else in the data dir is closed."""
    namespaces = tenancy.data_dir / "namespaces"
    passage = 0o700 if tenancy.uids is None else 0o711
    assert stat.S_IMODE(namespaces.stat().st_mode) == passage
    if tenancy.uids is not None:
        assert stat.S_IMODE(tenancy.data_dir.stat().st_mode) == 0o711
        for entry in tenancy.data_dir.iterdir():
            if entry.name != "namespaces":
                info = entry.lstat()
                assert info.st_uid == os.getuid() and not stat.S_IMODE(info.st_mode) & 0o077, entry
    for ns in (ALICE, BOB):
        root = namespaces / Namespace.parse(ns).safe_name
        owner = os.getuid() if tenancy.uids is None else tenancy.findings[Namespace.parse(ns).safe_name]["uid"]
        for path in (root, *(root / sub for sub in SUBDIRS)):
            info = path.lstat()
            assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700, path
            assert (info.st_uid, info.st_gid) == (owner, owner if tenancy.uids else info.st_gid), path
        found = tenancy.findings[Namespace.parse(ns).safe_name]
        assert Path(found["cwd"]).resolve() == (root / "home").resolve()
        assert found["own_home_writable"]


def test_prepare_dirs_tightens_loose_modes_and_refuses_symlinked_dirs(tmp_path: Path) -> None:
    """An existing namespace tree left world-readable is closed again; a symlink planted for a subdir is refused."""
    ns = Namespace.parse("ci:job-1")
    dirs = prepare_dirs(tmp_path, ns)
    loosened = (tmp_path / "namespaces", dirs.root, dirs.home)
    for path in loosened:
        os.chmod(path, 0o755)
    prepare_dirs(tmp_path, ns)
    assert {stat.S_IMODE(p.stat().st_mode) for p in loosened} == {0o700}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dirs.cache.rmdir()
    dirs.cache.symlink_to(elsewhere)
    with pytest.raises(ValueError, match="is a symlink"):
        prepare_dirs(tmp_path, ns)


def test_prepare_dirs_refuses_a_symlink_planted_for_the_namespace_itself(tmp_path: Path) -> None:
    """The namespace's own directory swapped for a symlink (to another tenant's) is refused, not followed."""
    bob = prepare_dirs(tmp_path, Namespace.parse("user:bob"))
    (tmp_path / "namespaces" / "user.mallory").symlink_to(bob.root)
    with pytest.raises(InvalidNamespace, match="user.mallory is a symlink"):
        prepare_dirs(tmp_path, Namespace.parse("user:mallory"))
    assert stat.S_IMODE(bob.root.stat().st_mode) == 0o700


# --- inherited handles ------------------------------------------------------------------------------


def test_workers_start_with_only_stdin_stdout_stderr(tenancy: TenancyRun) -> None:
    """No socket, pipe or file of the supervisor (store, API socket, another worker) is inherited."""
    for ns in (ALICE, BOB):
        fds = tenancy.findings[Namespace.parse(ns).safe_name]["fds"]
        assert sorted(fds) == ["0", "1", "2"], fds
        assert all(target.startswith("pipe:") for target in fds.values()), fds


def test_running_workers_share_no_channel_but_their_own_pipes(tenancy: TenancyRun) -> None:
    """The only objects a worker shares with the supervisor are its own stdio pipes; none with the other worker.

    This is also why there is no bridge socket or task token to steal: tools reach the supervisor only
    through the worker's own stdio (the Claude adapter's MCP server is in-process, the scripted one in-band).
    """
    channels = {ns: {t for t in fds.values() if t.startswith(("pipe:", "socket:"))}
                for ns, fds in tenancy.fds.items()}
    for ns, own in channels.items():
        assert own & tenancy.supervisor_fds <= tenancy.stdio[ns], ns
        assert tenancy.stdio[ns] <= own  # the check saw the pipes it should
        files = [t for t in tenancy.fds[ns].values() if t.startswith("/")]
        own_root = str(tenancy.data_dir.resolve() / "namespaces" / Namespace.parse(ns).safe_name)
        assert not [f for f in files if f.startswith(str(tenancy.data_dir.resolve())) and
                    not f.startswith(own_root)], files
    assert not channels[ALICE] & channels[BOB]


# --- secrets in outputs -----------------------------------------------------------------------------


def test_the_run_exercised_every_output(tenancy: TenancyRun) -> None:
    """Guards the grep below against passing vacuously: the secrets were in place and every path was taken."""
    assert tenancy.findings["user.bob"]["env"]["BOB_DB_PASSWORD"] == BOB_ENV["BOB_DB_PASSWORD"]
    assert tenancy.auth[f"{BOB}/claude"]["status"]["method"] == "api_key"  # Bob's key reached Bob's adapter
    alice = tenancy.auth[f"{ALICE}/claude"]["status"]
    assert (alice["method"], alice["account_hint"]) == ("oauth_local", "c***@example.com")
    assert "no-such-runtime" in tenancy.outputs[f"{ALICE} ensure_login(no-such-runtime) error"]
    assert tenancy.outputs["crash seen"] == "yes"
    log = tenancy.outputs["supervisor log"]
    assert "stderr:" in log and "crashing on purpose" in log  # worker stderr was mirrored into the log
    events = " ".join(v for k, v in tenancy.outputs.items() if k.startswith("events of"))
    assert "path_refused" in events and "XDG_CONFIG_HOME" not in events
    assert any(k.startswith("file blobs/") for k in tenancy.outputs)


def test_no_secret_appears_in_any_output(tenancy: TenancyRun) -> None:
    """Events, blobs, the raw database, logs, worker stderr, auth statuses, errors: no canary anywhere."""
    outputs = dict(tenancy.outputs)
    outputs |= {f"auth {k}": json.dumps(v) for k, v in tenancy.auth.items()}
    leaks = [(label, name) for label, text in outputs.items() for name, secret in tenancy.secrets().items()
             if secret in text]
    assert leaks == []


def test_a_worker_sees_no_secret_of_its_neighbour_or_the_supervisor(tenancy: TenancyRun) -> None:
    """Alice's probe (env, fds, everything it recorded) holds nothing of Bob's or the supervisor's."""
    alice = json.dumps(tenancy.findings["user.alice"])
    bob = json.dumps(tenancy.findings["user.bob"])
    for secret in (*SUPERVISOR_SECRETS.values(), *BOB_ENV.values(), BOB_FILE_SECRET, *tenancy.api_tokens):
        assert secret not in alice
    for secret in (*SUPERVISOR_SECRETS.values(), ALICE_OAUTH_SECRET, *tenancy.api_tokens):
        assert secret not in bob


def test_cli_output_never_contains_a_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The `codesdk` commands a user runs (run with --env, a crash, events, sessions, show, auth, namespaces)."""
    for name, value in SUPERVISOR_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CODESDK_SCENARIO_DIR", COMMON_ENV["CODESDK_SCENARIO_DIR"])
    data = ["--data-dir", str(tmp_path / "data")]
    env_args = [arg for k, v in BOB_ENV.items() for arg in ("--env", f"{k}={v}")]
    codes = [cli_main([*data, "run", "hi", "--namespace", BOB, "--scenario", scenario, "--non-interactive",
                       *env_args, *json_flag]) for scenario in ("fail", "crash-exit") for json_flag in ([], ["--json"])]
    runs = capsys.readouterr()
    created = [json.loads(line) for line in runs.out.splitlines() if '"session.created"' in line]
    session_id = created[-1]["trace"]["session_id"]  # the crashed one
    codes += [cli_main([*data, *command]) for command in (
        ["sessions"], ["sessions", "--json"], ["events", session_id], ["events", session_id, "--json"],
        ["show", session_id], ["auth", "--namespace", BOB], ["auth", "--namespace", BOB, "--json"],
        ["namespaces"], ["events", "ses_missing"])]
    rest = capsys.readouterr()
    printed = runs.out + runs.err + rest.out + rest.err
    assert codes[:4] == [1, 1, 1, 1] and codes[-1] != 0  # the runs failed and crashed as scripted
    assert "WORKER_CRASHED" in printed  # (its stderr tail is a blob: grepped in the tenancy run)
    for name, secret in {**SUPERVISOR_SECRETS, **BOB_ENV}.items():
        assert secret not in printed, name


def test_claude_auth_status_never_contains_a_secret(tmp_path: Path) -> None:
    """Every branch of the Claude auth check: API key, OAuth files, not logged in — none repeats a secret."""
    key, token, user = f"canary-key-{_RUN}", f"canary-token-{_RUN}", f"canary-user-{_RUN}"
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    statuses = [claude_env.auth_status({"HOME": str(home), "ANTHROPIC_API_KEY": key}),
                claude_env.auth_status({"HOME": str(home), "ANTHROPIC_AUTH_TOKEN": token})]
    (home / ".claude" / ".credentials.json").write_text(json.dumps({"claudeAiOauth": {"accessToken": token}}))
    (home / ".claude.json").write_text(json.dumps({"oauthAccount": {"emailAddress": f"{user}@example.com"}}))
    statuses.append(claude_env.auth_status({"HOME": str(home)}))
    (home / ".claude.json").write_text(json.dumps({"oauthAccount": {"emailAddress": user}}))  # no domain
    statuses.append(claude_env.auth_status({"HOME": str(home)}))
    statuses.append(claude_env.auth_status({"HOME": str(tmp_path / "nobody")}))
    text = json.dumps([s.to_json_obj() for s in statuses])
    assert [s.method for s in statuses] == ["api_key", "api_key", "oauth_local", "oauth_local", None]
    for secret in (key, token, user):
        assert secret not in text


# --- per-namespace uids: what the kernel refuses (run as root; skipped otherwise) ------------------------


def _needs_uids(run: TenancyRun) -> None:
    if run.uids is None:
        pytest.skip(why_no_worker_uids() or "the run had no worker uid range")


def test_each_namespace_worker_runs_as_its_own_uid_without_groups(tenancy: TenancyRun) -> None:
    _needs_uids(tenancy)
    assert tenancy.uids is not None
    ids = {ns: (f["uid"], f["gid"], f["groups"]) for ns, f in tenancy.findings.items()}
    alice, bob = ids["user.alice"], ids["user.bob"]
    assert alice[0] != bob[0] and os.getuid() not in (alice[0], bob[0])
    for uid, gid, groups in (alice, bob):
        assert uid in tenancy.uids and gid == uid and groups == []
    assigned = json.loads((tenancy.data_dir / UIDS_FILE).read_text())["assigned"]
    assert assigned == {ALICE: alice[0], BOB: bob[0]}


def test_worker_cannot_read_another_namespace_home(tenancy: TenancyRun) -> None:
    """Alice's worker tries Bob's files and Bob's tries Alice's OAuth login: EACCES at their namespace root."""
    _needs_uids(tenancy)
    for reader, owner in (("user.alice", "user.bob"), ("user.bob", "user.alice")):
        found = tenancy.findings[reader]
        assert not found["namespaces_listable"] and not found["data_dir_listable"]
        other = found["others"][owner]
        assert not other["home_listable"] and other["home_files_readable"] == []
        assert set(other["reads"].values()) == {"EACCES"}, other["reads"]
    assert tenancy.findings["user.alice"]["own_home_writable"]


def test_worker_cannot_read_the_supervisor_process_environment(tenancy: TenancyRun) -> None:
    _needs_uids(tenancy)
    assert not tenancy.findings["user.alice"]["supervisor_environ_readable"]
    assert tenancy.findings["user.alice"]["supervisor_environ"] == "EACCES"


def test_worker_cannot_read_the_supervisor_token_files(tenancy: TenancyRun) -> None:
    """The store (database, WAL, blobs), the token files and the uid assignments: each refused with EACCES —
    not ENOENT, which the passable (0711) data dir would report for a missing one, so all were there."""
    _needs_uids(tenancy)
    for ns in ("user.alice", "user.bob"):
        found = tenancy.findings[ns]
        assert found["data_dir_files_readable"] == []
        reads = found["data_dir_reads"]
        assert set(reads.values()) == {"EACCES"}, reads
