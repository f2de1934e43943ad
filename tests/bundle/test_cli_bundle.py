"""``codesdk bundle`` as a user runs it: real processes, a real data dir, one-line refusals."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import httpx2 as httpx

from codesdk.supervisor.namespaces import NamespaceEnv

from tests.e2e.test_cli import CLI, _env
from tests.service.test_service import _client, _start
from tests.waits import HANG_GUARD_S, wait_for
from tests.worker.harness import REPO
from tests.bundle.conftest import leaks


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env=_env(tmp_path),
                          stdin=subprocess.DEVNULL, cwd=REPO, check=False)


def _one_line_refusal(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(("codesdk: ", "codesdk bundle: error: ")), done.stderr
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_bundle_write_inspect_and_refusals(tmp_path: Path) -> None:
    canary = "cli-canary-value-9f8e7d"
    key = "sk-clicanary0123456789abcdef"
    NamespaceEnv(tmp_path / "data").update("default", {"SOME_TOKEN": canary})
    done = _run(tmp_path, "run", f"remember {canary} and {key}", "--json")
    assert done.returncode == 0, done.stderr
    session_id = json.loads(done.stdout.splitlines()[0])["trace"]["session_id"]
    assert canary in done.stdout  # it is in the session: the bundle must take it out

    out = tmp_path / "b.tar.gz"
    written = _run(tmp_path, "bundle", session_id, "-o", str(out))
    assert written.returncode == 0, written.stderr
    assert str(out) in written.stderr and "redactions" in written.stderr
    assert leaks(out, [canary, key]) == []

    inspected = _run(tmp_path, "bundle", "--inspect", str(out))
    assert inspected.returncode == 0, inspected.stderr
    assert session_id in inspected.stdout and "namespace_env=" in inspected.stdout and "key=" in inspected.stdout
    as_json = _run(tmp_path, "bundle", "--inspect", str(out), "--json")
    assert json.loads(as_json.stdout)["session_id"] == session_id

    before = out.read_bytes()
    _one_line_refusal(_run(tmp_path, "bundle", session_id, "-o", str(out)), "exists", "--force")
    assert out.read_bytes() == before
    assert _run(tmp_path, "bundle", session_id, "-o", str(out), "--force").returncode == 0

    _one_line_refusal(_run(tmp_path, "bundle", "ses_" + "0" * 32, "-o", str(tmp_path / "x.tar.gz")), "no session")
    assert not (tmp_path / "x.tar.gz").exists()
    _one_line_refusal(_run(tmp_path, "bundle", session_id, "-o", str(tmp_path / "nodir" / "x.tar.gz")),
                      "does not exist")
    _one_line_refusal(_run(tmp_path, "bundle", session_id, "-o", str(tmp_path / "x.tar.gz"), "--redact", "(unclosed"),
                      "is not a regular expression")
    _one_line_refusal(_run(tmp_path, "bundle"), "SESSION")
    _one_line_refusal(_run(tmp_path, "bundle", session_id, "-o", str(tmp_path)), "is a directory")
    _one_line_refusal(_run(tmp_path, "bundle", "../../etc/x"), "-o FILE")

    tampered = tmp_path / "tampered.tar.gz"
    with tarfile.open(out, mode="r:gz") as tar, tarfile.open(tampered, mode="w:gz") as rewritten:
        for member in tar.getmembers():
            handle = tar.extractfile(member)
            assert handle is not None
            data = handle.read()
            if member.name == "health.json":
                data = data.replace(b"false", b"true ")
            member.size = len(data)
            rewritten.addfile(member, io.BytesIO(data))
    _one_line_refusal(_run(tmp_path, "bundle", "--inspect", str(tampered)), "health.json", "sha256")
    (tmp_path / "junk").write_text("not a bundle")
    _one_line_refusal(_run(tmp_path, "bundle", "--inspect", str(tmp_path / "junk")), "not a CodeSDK support bundle")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp files left


def test_bundle_through_the_running_service(tmp_path: Path) -> None:
    """With a service holding the data dir, the command goes through its API (as the admin), as ``--url`` does."""
    canary = "svc-canary-value-4c3b2a"
    NamespaceEnv(tmp_path / "data").update("default", {"SOME_TOKEN": canary})
    service = _start(tmp_path, quiet=True)
    try:
        _wait_ready(tmp_path)
        done = _run(tmp_path, "run", f"remember {canary}", "--json")
        assert done.returncode == 0, done.stderr
        session_id = json.loads(done.stdout.splitlines()[0])["trace"]["session_id"]

        out = tmp_path / "via-service.tar.gz"
        written = _run(tmp_path, "bundle", session_id, "-o", str(out))
        assert written.returncode == 0, written.stderr
        assert "going through its API" in written.stderr
        assert leaks(out, [canary]) == []
        assert _run(tmp_path, "bundle", "--inspect", str(out)).returncode == 0

        url = f"unix:{tmp_path / 'data' / 'api.sock'}"
        token = (tmp_path / "data" / "admin.token").read_text().strip()
        again = _run(tmp_path, "bundle", session_id, "-o", str(tmp_path / "again.tar.gz"), "--url", url,
                     "--token", token)
        assert again.returncode == 0, again.stderr
        assert leaks(tmp_path / "again.tar.gz", [canary, token]) == []
        _one_line_refusal(_run(tmp_path, "bundle", session_id, "-o", str(tmp_path / "x.tar.gz"), "--url", url,
                               "--token", token, "--redact", "abc"), "--redact", "bundle-redact.txt")
        _one_line_refusal(_run(tmp_path, "bundle", "ses_" + "1" * 32, "-o", str(tmp_path / "x.tar.gz"), "--url", url,
                               "--token", token), "no session")
        assert not (tmp_path / "x.tar.gz").exists()
    finally:
        service.terminate()
        service.wait(timeout=HANG_GUARD_S)


def _wait_ready(tmp_path: Path) -> None:
    wait_for("the service's admin token and socket", lambda: (tmp_path / "data" / "admin.token").exists()
             and (tmp_path / "data" / "api.sock").exists())
    with _client(tmp_path) as client:
        wait_for("the service to be ready", lambda: _ready(client))


def _ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False
