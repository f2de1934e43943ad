"""The support bundle written from a real session: nothing secret in it, everything else there, read back."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from codesdk.supervisor import bundle
from codesdk.supervisor.bundle import _archive
from codesdk.supervisor.bundle import BundleError, inspect_bundle, sources_from_engine, write_bundle
from codesdk.supervisor.store import UnknownSession

from tests.conftest import MakeEngine
from tests.e2e.conftest import run_task
from tests.bundle.conftest import NAMESPACE, Canaries, canary_session, leaks, members


async def test_canaries_never_leave_and_the_manifest_counts_them(make_engine: MakeEngine, tmp_path: Path) -> None:
    canaries = Canaries.new()
    data_dir = tmp_path / "data"
    out = tmp_path / "out" / "b.tar.gz"
    out.parent.mkdir()
    async with make_engine(data_dir=data_dir) as engine:
        session_id = await canary_session(engine, canaries, tmp_path / "ws", data_dir)
        # the canaries are really where the bundle takes its content from
        events = [e.to_json_obj() for e in await engine.store.read(session_id)]
        assert canaries.prompt_key in json.dumps(events) and canaries.env in json.dumps(events)
        worker = engine.pool.worker_of(NAMESPACE)
        assert worker is not None and canaries.env in worker.stderr.text()
        manifest = await write_bundle(await sources_from_engine(engine, session_id), out)

    assert leaks(out, canaries.all()) == []
    files = members(out)
    assert next(iter(files)) == "manifest.json"
    assert {"events.jsonl", "environment.json", "config.json", "workers.json", "health.json"} <= set(files)
    lines = [json.loads(line) for line in files["events.jsonl"].splitlines()]
    assert len(lines) == manifest["counts"]["events"] == len(events)
    assert [e["seq"] for e in lines] == [e["seq"] for e in events]
    assert lines[-1]["type"] == "task.completed"
    included = [b for b in manifest["blobs"] if b["included"]]
    assert included and all(f"blobs/{b['ref'].removeprefix('sha256:')}" in files for b in included)

    by_file = manifest["redactions"]["by_file"]
    assert by_file["events.jsonl"]["namespace_env"] >= 1 and by_file["events.jsonl"]["key"] >= 1
    blob_kinds: dict[str, int] = {}
    for where, kinds in by_file.items():
        if where.startswith("blobs/"):
            for kind, n in kinds.items():
                blob_kinds[kind] = blob_kinds.get(kind, 0) + n
    assert blob_kinds.get("private_key", 0) >= 1 and blob_kinds.get("pattern", 0) >= 1  # the tool's result
    assert by_file["workers.json"].get("authorization", 0) >= 1  # the stderr tail
    assert by_file["workers.json"].get("namespace_env", 0) >= 1
    assert b"[REDACTED:private_key]" in b"".join(v for k, v in files.items() if k.startswith("blobs/"))
    workers = json.loads(files["workers.json"])
    assert workers["namespace"] == NAMESPACE and workers["status"]["namespace"] == NAMESPACE
    assert "[REDACTED:authorization]" in workers["stderr_tail"]
    environment = json.loads(files["environment.json"])
    assert environment["codesdk_version"] and environment["session_runtime"] == "scripted"
    assert environment["isolation"] == "namespaced"
    assert any(r["name"] == "scripted" for r in environment["worker"]["runtimes"])
    matrix = {row["runtime"]: row for row in environment["mcp_transports"]}
    assert matrix["claude"]["chosen"] == "stdio" and "sse" in matrix["claude"]["supports"]
    assert matrix["codex"]["chosen"] is None and "in band" in matrix["codex"]["why"]
    assert matrix["scripted"] == {"runtime": "scripted", "supports": [], "chosen": None,
                                  "why": "CodeSDK's tools reach it in band (its adapter relays each call): no MCP "
                                         "server is given to it"}
    config = json.loads(files["config.json"])
    assert [v["name"] for v in config["namespace_env"]] == ["CANARY_VAR"]
    assert config["redaction_patterns"]["count"] == 1
    assert inspect_bundle(out)["session_id"] == session_id


async def test_other_tenants_are_not_in_it(make_engine: MakeEngine, tmp_path: Path) -> None:
    """workers.json holds the session's namespace only, and another namespace's variables stay out."""
    canaries = Canaries.new()
    data_dir = tmp_path / "data"
    async with make_engine(data_dir=data_dir) as engine:
        session_id = await canary_session(engine, canaries, tmp_path / "ws", data_dir)
        engine.pool.namespace_env.update("user:other", {"OTHER_VAR": "other-tenant-value-123"})
        await run_task(engine, "hi", namespace="user:other")
        assert {s["namespace"] for s in engine.pool.status()} == {NAMESPACE, "user:other"}
        sources = await sources_from_engine(engine, session_id)
        await write_bundle(sources, tmp_path / "b.tar.gz")
    text = b"".join(members(tmp_path / "b.tar.gz").values())
    assert b"user:other" not in text and b"OTHER_VAR" not in text


async def test_unknown_session_and_outputs_refused(make_engine: MakeEngine, tmp_path: Path) -> None:
    canaries = Canaries.new()
    data_dir = tmp_path / "data"
    async with make_engine(data_dir=data_dir) as engine:
        with pytest.raises(UnknownSession):
            await sources_from_engine(engine, "ses_" + "0" * 32)
        session_id = await canary_session(engine, canaries, tmp_path / "ws", data_dir)
        sources = await sources_from_engine(engine, session_id)
        existing = tmp_path / "existing.tar.gz"
        existing.write_bytes(b"keep me")
        with pytest.raises(BundleError, match="exists; pass --force"):
            await write_bundle(sources, existing)
        assert existing.read_bytes() == b"keep me"
        with pytest.raises(BundleError, match="does not exist"):
            await write_bundle(sources, tmp_path / "no" / "such" / "b.tar.gz")
        await write_bundle(sources, existing, force=True)
        assert inspect_bundle(existing)["session_id"] == session_id


async def test_a_failure_leaves_nothing_behind(make_engine: MakeEngine, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    canaries = Canaries.new()
    data_dir = tmp_path / "data"
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "b.tar.gz").write_bytes(b"the old one")
    async with make_engine(data_dir=data_dir) as engine:
        session_id = await canary_session(engine, canaries, tmp_path / "ws", data_dir)
        sources = await sources_from_engine(engine, session_id)
        calls: list[str] = []
        real_add = _archive._add

        def add_then_fail(tar: tarfile.TarFile, name: str, handle: Any, size: int) -> None:
            calls.append(name)
            if len(calls) == 3:  # part of the archive is written already
                raise OSError(28, "No space left on device")
            real_add(tar, name, handle, size)

        monkeypatch.setattr(_archive, "_add", add_then_fail)
        with pytest.raises(OSError, match="No space"):
            await write_bundle(sources, out_dir / "b.tar.gz", force=True)
        calls.clear()
        with pytest.raises(OSError, match="No space"):
            await write_bundle(sources, out_dir / "new.tar.gz")
    assert sorted(p.name for p in out_dir.iterdir()) == ["b.tar.gz"]  # no temp file, no staging dir, no new.tar.gz
    assert (out_dir / "b.tar.gz").read_bytes() == b"the old one"


def _rewrite(src: Path, dst: Path, change: dict[str, bytes]) -> None:
    with tarfile.open(src, mode="r:gz") as tar, tarfile.open(dst, mode="w:gz") as out:
        for member in tar.getmembers():
            handle = tar.extractfile(member)
            assert handle is not None
            data = change.get(member.name, handle.read())
            member.size = len(data)
            out.addfile(member, io.BytesIO(data))


async def test_inspect_good_tampered_and_foreign(make_engine: MakeEngine, tmp_path: Path) -> None:
    canaries = Canaries.new()
    data_dir = tmp_path / "data"
    good = tmp_path / "good.tar.gz"
    async with make_engine(data_dir=data_dir) as engine:
        session_id = await canary_session(engine, canaries, tmp_path / "ws", data_dir)
        await write_bundle(await sources_from_engine(engine, session_id), good)
    manifest = inspect_bundle(good)
    assert manifest["format"] == "codesdk-support-bundle" and manifest["session_id"] == session_id
    text = "\n".join(bundle.summary_lines(manifest))
    assert session_id in text and "private_key=" in text

    events = members(good)["events.jsonl"]
    tampered = tmp_path / "tampered.tar.gz"
    _rewrite(good, tampered, {"events.jsonl": events.replace(b"You said", b"You paid")})
    with pytest.raises(BundleError, match="does not match its sha256"):
        inspect_bundle(tampered)
    extra = tmp_path / "extra.tar.gz"
    with tarfile.open(good, mode="r:gz") as tar, tarfile.open(extra, mode="w:gz") as out:
        for member in tar.getmembers():
            out.addfile(member, tar.extractfile(member))
        info = tarfile.TarInfo("blobs/planted")
        info.size = 3
        out.addfile(info, io.BytesIO(b"bad"))
    with pytest.raises(BundleError, match="not listed in the manifest"):
        inspect_bundle(extra)
    for name, content in (("notgz", b"hello"), ("empty", b"")):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(BundleError, match="not a CodeSDK support bundle"):
            inspect_bundle(tmp_path / name)
    with pytest.raises(BundleError, match="no such file"):
        inspect_bundle(tmp_path / "missing.tar.gz")
