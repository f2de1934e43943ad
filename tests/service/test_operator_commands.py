"""The operator's commands beside the service (issue 33, items 10, 12, 13 and the small ones): SIGHUP reloads,
tokens have ids and can be listed, revoked and rotated, a broken token file fails closed, and every operator
command finds the running service the same way (the data dir's lock file)."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx2 as httpx
import pytest

from codesdk.supervisor.api import TokenAuth
from codesdk.supervisor.cli.admin import main
from tests.service.test_service import _start, _wait_socket
from tests.waits import wait_for
from tests.worker.harness import REPO


def _admin(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "codesdk.supervisor.cli.admin", *args], capture_output=True,
                          text=True, timeout=60, cwd=REPO, check=False, stdin=subprocess.DEVNULL)


def _status(socket_path: Path, token: str, namespace: str = "user:alice") -> int:
    transport = httpx.HTTPTransport(uds=str(socket_path))
    with httpx.Client(transport=transport, base_url="http://codesdk", timeout=30,
                      headers={"Authorization": f"Bearer {token}"}) as client:
        return client.post("/v1/sessions", json={"namespace": namespace}).status_code


# -- item 12: tokens ------------------------------------------------------------------------------------------


def _add(data: Path, name: str, *namespaces: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["token", "add", name, *[a for ns in namespaces for a in ("--namespace", ns)],
                 "--data-dir", str(data)])
    out = capsys.readouterr()
    return code, out.out.strip(), out.err


def test_tokens_have_ids_and_can_be_listed_revoked_and_rotated(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    code, alice, err = _add(data, "alice", "user:alice", capsys=capsys)
    assert code == 0, err
    code, bob, err = _add(data, "bob", "user:bob", capsys=capsys)
    assert code == 0, err
    assert main(["token", "list", "--data-dir", str(data)]) == 0
    listed = capsys.readouterr().out
    assert "alice" in listed and "bob" in listed and "user:alice" in listed and "tok_" in listed
    assert alice not in listed  # never the token itself
    alice_id = next(line.split()[0] for line in listed.splitlines() if "alice" in line)
    assert TokenAuth.load(data).authenticate(alice) is not None
    # rotate: a new token for the same id, name and namespaces; the old one stops working
    assert main(["token", "rotate", alice_id, "--data-dir", str(data)]) == 0
    rotated = capsys.readouterr().out.strip()
    auth = TokenAuth.load(data)
    assert auth.authenticate(alice) is None
    principal = auth.authenticate(rotated)
    assert principal is not None and principal.name == "alice" and principal.namespaces == {"user:alice"}
    # revoke by name
    assert main(["token", "revoke", "bob", "--data-dir", str(data)]) == 0
    assert "revoked" in capsys.readouterr().err
    assert TokenAuth.load(data).authenticate(bob) is None
    assert main(["token", "revoke", "nobody", "--data-dir", str(data)]) == 2
    assert "no token" in capsys.readouterr().err


def test_a_token_name_is_unique_per_namespace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    assert _add(data, "alice", "user:alice", capsys=capsys)[0] == 0
    code, out, err = _add(data, "alice", "user:alice", capsys=capsys)
    assert code == 2 and not out and "alice" in err and "already" in err
    assert _add(data, "alice", "user:other", capsys=capsys)[0] == 0  # another namespace: another alice


def test_token_add_says_where_it_wrote_and_refuses_a_data_dir_that_does_not_exist(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _add(tmp_path / "absent", "alice", "user:alice", capsys=capsys)
    assert code == 2 and not out and "does not exist" in err and str(tmp_path / "absent") in err
    assert not (tmp_path / "absent").exists()
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    code, out, err = _add(data, "alice", "user:alice", capsys=capsys)
    assert code == 0 and str(data / "api-tokens.json") in err


def test_a_token_file_that_fails_to_parse_fails_closed_but_the_admin_token_works(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    auth = TokenAuth.bootstrap(data)
    alice = auth.add_principal("alice", ["user:alice"])
    admin = (data / "admin.token").read_text().strip()
    assert auth.authenticate(alice) is not None
    (data / "api-tokens.json").write_text('{"version": 1, "tokens": [')  # a half-written edit
    assert auth.authenticate(alice) is None
    admitted = auth.authenticate(admin)
    assert admitted is not None and admitted.admin
    assert any("no tenant token" in r.getMessage() for r in caplog.records), caplog.text


# -- the small ones -------------------------------------------------------------------------------------------


def test_namespace_env_set_refuses_an_empty_value_from_stdin(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["namespace", "env", "set", "user:alice", "API_KEY", "--data-dir", str(data)]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["namespace", "env", "list", "user:alice", "--data-dir", str(data)]) == 0
    assert "API_KEY" not in capsys.readouterr().out


# -- with a running service: items 10 and 13 ----------------------------------------------------------------


def test_operator_commands_find_a_service_listening_elsewhere_and_report_once(tmp_path: Path) -> None:
    """The unit's flags: --listen in $RUNTIME_DIRECTORY, not DATA_DIR/api.sock. The lock file says where."""
    data = tmp_path / "data"
    run = tmp_path / "run"
    run.mkdir()
    proc = _start(tmp_path, None, "--listen", str(run / "api.sock"), quiet=True)
    try:
        wait_for("the service to announce its API", lambda: (run / "api.sock").exists()
                 and (data / "admin.token").exists() and _admin("quarantine", "list", "--data-dir",
                                                                 str(data)).returncode == 0)
        bad = _admin("quarantine", "lift", "bad ns", "--data-dir", str(data))
        assert bad.returncode == 2 and "invalid namespace" in bad.stderr, bad.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    gone = _admin("quarantine", "list", "--data-dir", str(data))
    assert gone.returncode == 3
    assert gone.stderr.count("running") == 1 and gone.stderr.count("\n") == 1, gone.stderr


def _token_then_sighup(tmp_path: Path, proc: subprocess.Popen[bytes], *, tokens_file: str | None = None,
                       ) -> tuple[str, str]:
    """Add a token for alice, optionally overwrite the tokens file with ``tokens_file``, send SIGHUP: (alice's
    token, the service's SIGHUP log line)."""
    data = tmp_path / "data"
    assert proc.stderr is not None
    _wait_socket(tmp_path)
    added = _admin("token", "add", "alice", "--namespace", "user:alice", "--data-dir", str(data))
    assert added.returncode == 0, added.stderr
    if tokens_file is not None:
        (data / "api-tokens.json").write_text(tokens_file)
    proc.send_signal(signal.SIGHUP)
    line = ""
    while "SIGHUP" not in line:
        line = proc.stderr.readline().decode()
        assert line, "the service ended on SIGHUP"
    return added.stdout.strip(), line


def test_sighup_reloads_tokens_and_never_ends_the_service(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = _start(tmp_path, None)
    try:
        token, line = _token_then_sighup(tmp_path, proc)
        assert "reload" in line, line
        assert proc.poll() is None
        assert _status(data / "api.sock", token) == 201
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0


def test_sighup_with_a_broken_tokens_file_says_the_reload_failed(tmp_path: Path) -> None:
    """The SIGHUP line never reads as a success when the tokens file did not load (it fails closed)."""
    data = tmp_path / "data"
    proc = _start(tmp_path, None)
    try:
        token, line = _token_then_sighup(tmp_path, proc, tokens_file="{broken")
        assert "did NOT load" in line and "token(s) from" not in line, line
        assert _status(data / "api.sock", token) == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0


def test_tenants_sharing_one_uid_are_warned_about_at_any_uid(tmp_path: Path) -> None:
    proc = _start(tmp_path, None)
    try:
        _wait_socket(tmp_path)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert b"--worker-uids" in err and b"one uid" in err, err


def test_tokens_file_keeps_ids_across_loads(tmp_path: Path) -> None:
    data = tmp_path / "data"
    auth = TokenAuth.bootstrap(data)
    auth.add_principal("alice", ["user:alice"])
    doc = json.loads((data / "api-tokens.json").read_text())
    ids = [t["id"] for t in doc["tokens"]]
    assert len(set(ids)) == 2 and all(i.startswith("tok_") for i in ids)
    TokenAuth.load(data).save()
    assert [t["id"] for t in json.loads((data / "api-tokens.json").read_text())["tokens"]] == ids


# -- item 11: SIGTERM drains open event streams -------------------------------------------------------------


def test_sigterm_delivers_open_streams_the_stopped_tasks_final_events_then_ends_them(tmp_path: Path) -> None:
    """A client following a session over SSE sees its task's task.stopped, then a cleanly ended body."""
    import threading

    data = tmp_path / "data"
    proc = _start(tmp_path, None)
    assert proc.stderr is not None
    token = ""
    try:
        _wait_socket(tmp_path)
        token = (data / "admin.token").read_text().strip()
        transport = httpx.HTTPTransport(uds=str(data / "api.sock"))
        with httpx.Client(transport=transport, base_url="http://codesdk", timeout=None,
                          headers={"Authorization": f"Bearer {token}"}) as client:
            session = client.post("/v1/sessions", json={"namespace": "default"}).json()
            sid = session["session_id"]
            task = client.post(f"/v1/sessions/{sid}/tasks",
                               json={"prompt": "x", "runtime_config": {"scenario": "hang"}}).json()
            wait_for("the task to run", lambda: client.get(f"/v1/tasks/{task['task_id']}").json()["state"]
                     == "running")
            types: list[str] = []
            ended_cleanly: list[bool] = []
            streaming = threading.Event()

            def follow() -> None:
                try:
                    with client.stream("GET", f"/v1/sessions/{sid}/events/stream") as response:
                        for line in response.iter_lines():
                            streaming.set()
                            if line.startswith("event: "):
                                types.append(line[len("event: "):])
                    ended_cleanly.append(True)
                except httpx.HTTPError as exc:
                    types.append(f"cut: {exc!r}")
                    ended_cleanly.append(False)
                finally:
                    streaming.set()

            follower = threading.Thread(target=follow)
            follower.start()
            assert streaming.wait(60)
            wait_for("the stream to reach the running task", lambda: "task.started" in types
                     or "task.running" in types or len(types) >= 3)
            proc.send_signal(signal.SIGTERM)
            follower.join(120)
            assert not follower.is_alive()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert ended_cleanly == [True], (types[-4:], err.decode()[-3000:])
    assert "task.stopped" in types, types
    assert b"drain" in err and b"stream" in err, err


def test_a_file_written_before_unique_names_loads_and_names_the_clash(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    from codesdk.supervisor.api import TOKENS_FILE, hash_token

    (tmp_path / TOKENS_FILE).write_text(json.dumps({"version": 1, "tokens": [
        {"name": "alice", "sha256": hash_token(t), "admin": False, "namespaces": ["user:alice"]} for t in "ab"]}))
    auth = TokenAuth.load(tmp_path)
    assert [principal.name for _, principal in auth.records()] == ["alice", "alice"]
    assert any("both named 'alice'" in r.getMessage() for r in caplog.records), caplog.text
