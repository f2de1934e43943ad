"""Artifacts: a blob a session's events name, downloaded by the session's readers through the API, both clients and
the CLI; whole or by range, cached by its hash; never a blob the session does not name, whatever its text says."""

from __future__ import annotations

import hashlib
import io
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from codesdk import AsyncClient, Client, NotFound
from codesdk.supervisor.api._ranges import Unsatisfiable, byte_range

from tests.api.conftest import Api


async def _finished(api: Api, token: str, session_id: str, prompt: str = "hello") -> list[dict[str, Any]]:
    """Run an echo task in the session to its end; the session's events."""
    r = await api.client.post(f"/v1/sessions/{session_id}/tasks", headers=api.auth(token),
                              json={"prompt": prompt, "runtime_config": {"scenario": "echo"}})
    assert r.status_code == 202, r.text
    task_id = r.json()["task_id"]
    while (await api.client.get(f"/v1/tasks/{task_id}", headers=api.auth(token))).json()["state"] in (
            "pending", "running"):
        await trio.sleep(0.05)
    page = await api.client.get(f"/v1/sessions/{session_id}/events?limit=1000", headers=api.auth(token))
    return list(page.json()["events"])


def _input_ref(events: list[dict[str, Any]]) -> str:
    [compiled] = [e["payload"]["input_ref"] for e in events if e["type"] == "model.input"]
    return str(compiled)


async def test_a_named_blob_downloads_whole_by_range_and_from_cache(api: Api) -> None:
    with trio.fail_after(60):
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        ref = _input_ref(await _finished(api, api.alice, sid))
        url, auth = f"/v1/sessions/{sid}/blobs/{ref}", api.auth(api.alice)
        whole = await api.client.get(url, headers=auth)
        assert whole.status_code == 200, whole.text
        assert "sha256:" + hashlib.sha256(whole.content).hexdigest() == ref
        assert whole.headers["content-type"].startswith("application/json")
        etag = whole.headers["etag"]
        assert etag == f'"{ref.removeprefix("sha256:")}"' and whole.headers["accept-ranges"] == "bytes"
        bare = await api.client.get(f"/v1/sessions/{sid}/blobs/{ref.removeprefix('sha256:')}", headers=auth)
        assert bare.content == whole.content
        cached = await api.client.get(url, headers={**auth, "If-None-Match": etag})
        assert cached.status_code == 304 and cached.content == b""
        size = len(whole.content)
        head = await api.client.get(url, headers={**auth, "Range": "bytes=0-9"})
        assert head.status_code == 206 and head.content == whole.content[:10]
        assert head.headers["content-range"] == f"bytes 0-9/{size}"
        tail = await api.client.get(url, headers={**auth, "Range": "bytes=-5"})
        assert tail.status_code == 206 and tail.content == whole.content[-5:]
        stale = await api.client.get(url, headers={**auth, "Range": "bytes=0-9", "If-Range": '"other"'})
        assert stale.status_code == 200 and stale.content == whole.content
        past = await api.client.get(url, headers={**auth, "Range": f"bytes={size}-"})
        assert past.status_code == 416 and past.headers["content-range"] == f"bytes */{size}"
        assert past.json()["error"]["code"] == "range_not_satisfiable"


async def test_a_blob_the_session_does_not_name_is_not_found_whatever_its_text_says(api: Api) -> None:
    with trio.fail_after(60):
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        ref = _input_ref(await _finished(api, api.alice, sid))
        empty = (await api.create_session(api.alice, "user:alice"))["session_id"]
        # a hostile prompt: the ref is in this session's prompt, its compiled input and the runtime's echo of it
        hostile = (await api.create_session(api.alice, "user:alice"))["session_id"]
        events = await _finished(api, api.alice, hostile, f"send me {ref} please")
        assert any(ref in str(e["payload"]) for e in events if e["type"] == "model.output.completed")
        for session_id in (empty, hostile):
            r = await api.client.get(f"/v1/sessions/{session_id}/blobs/{ref}", headers=api.auth(api.alice))
            assert r.status_code == 404 and r.json()["error"]["code"] == "blob_not_found", r.text
        other_tenant = await api.client.get(f"/v1/sessions/{sid}/blobs/{ref}", headers=api.auth(api.bob))
        assert other_tenant.status_code == 404 and other_tenant.json()["error"]["code"] == "session_not_found"
        for bad in ("nope", "sha256:xyz", "sha256:" + "0" * 64):
            r = await api.client.get(f"/v1/sessions/{sid}/blobs/{bad}", headers=api.auth(api.alice))
            assert r.status_code == 404, (bad, r.text)


async def test_both_clients_download_a_blob_and_name_what_is_missing(api: Api) -> None:
    with trio.fail_after(60):
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        ref = _input_ref(await _finished(api, api.alice, sid))
        async with AsyncClient(socket=api.socket, token=api.alice) as client:
            into = io.BytesIO()
            assert await client.download(sid, ref, into) == len(into.getvalue())
            assert "sha256:" + hashlib.sha256(into.getvalue()).hexdigest() == ref
            with pytest.raises(NotFound, match="names no blob"):
                await client.download(sid, "sha256:" + "1" * 64, io.BytesIO())

        def blocking() -> bytes:
            with Client(socket=api.socket, token=api.alice) as sync_client:
                out = io.BytesIO()
                sync_client.download(sid, ref.removeprefix("sha256:"), out)
                return out.getvalue()

        assert await trio.to_thread.run_sync(blocking) == into.getvalue()


async def test_the_cli_writes_a_blob_from_the_service_and_refuses_a_bad_ref(api: Api, tmp_path: Path) -> None:
    with trio.fail_after(90):
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        ref = _input_ref(await _finished(api, api.alice, sid))
        out = tmp_path / "input.json"
        base = [sys.executable, "-m", "codesdk.supervisor.cli.front", "--url", f"unix:{api.socket}", "--token",
                api.alice, "blob", sid]
        done = await trio.run_process([*base, ref, "-o", str(out)], capture_stdout=True, capture_stderr=True,
                                      check=False)
        assert done.returncode == 0, done.stderr
        assert "sha256:" + hashlib.sha256(out.read_bytes()).hexdigest() == ref
        again = await trio.run_process([*base, ref, "-o", str(out)], capture_stderr=True, check=False)
        assert again.returncode != 0 and b"--force" in again.stderr  # never overwritten unasked
        stdout = await trio.run_process([*base, ref], capture_stdout=True, capture_stderr=True, check=False)
        assert stdout.returncode == 0 and stdout.stdout == out.read_bytes()
        bad = await trio.run_process([*base, "sha256:abc"], capture_stdout=True, capture_stderr=True, check=False)
        assert bad.returncode != 0 and bad.stdout == b"" and len(bad.stderr.decode().strip().splitlines()) == 1
        unnamed = await trio.run_process([*base, "0" * 64, "-o", str(tmp_path / "x")], capture_stderr=True,
                                         check=False)
        assert unnamed.returncode != 0 and b"names no blob" in unnamed.stderr and not (tmp_path / "x").exists()


@given(size=st.integers(0, 10_000), first=st.integers(0, 20_000), last=st.integers(0, 20_000) | st.none(),
       suffix=st.integers(0, 20_000))
def test_a_range_is_the_slice_a_reader_of_rfc_9110_expects(size: int, first: int, last: int | None,
                                                         suffix: int) -> None:
    data = bytes(range(256)) * (size // 256 + 1)
    data = data[:size]
    header = f"bytes={first}-{'' if last is None else last}"
    if last is not None and last < first:
        assert byte_range(header, size) is None  # invalid: ignored, the whole is sent
    elif first >= size:
        with pytest.raises(Unsatisfiable):
            byte_range(header, size)
    else:
        start, stop = byte_range(header, size) or (0, size)
        assert data[start:stop] == data[first:size if last is None else last + 1]
    if suffix == 0 or size == 0:
        with pytest.raises(Unsatisfiable):
            byte_range(f"bytes=-{suffix}", size)
    else:
        start, stop = byte_range(f"bytes=-{suffix}", size) or (0, size)
        assert data[start:stop] == data[-suffix:]


@given(st.text(max_size=40))
def test_any_other_range_header_means_the_whole_or_unsatisfiable(header: str) -> None:
    try:
        found = byte_range(header, 100)
    except Unsatisfiable:
        return
    assert found is None or 0 <= found[0] < found[1] <= 100
