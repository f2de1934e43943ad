"""``GET /v1/sessions/{id}/bundle``: the session's owner and the admin get it; anyone else, a session not there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import trio

from codesdk.supervisor.bundle import inspect_bundle

from tests.api.conftest import Api
from tests.bundle.conftest import leaks


async def test_owner_and_admin_get_it_others_see_no_session(api: Api, tmp_path: Path) -> None:
    canary = "alice-canary-value-0123"
    api.engine.pool.namespace_env.update("user:alice", {"ALICE_VAR": canary})
    session = await api.create_session(api.alice, "user:alice")
    sid = session["session_id"]
    task = await api.run_task(api.alice, sid)
    await api.engine.wait_task(task["task_id"])
    # a second task whose prompt (and so its echo) holds the stored value
    r = await api.client.post(f"/v1/sessions/{sid}/tasks", headers=api.auth(api.alice),
                              json={"prompt": f"here is {canary}", "runtime_config": {"scenario": "echo"}})
    assert r.status_code == 202, r.text
    await api.engine.wait_task(r.json()["task_id"])

    for who, token in (("owner", api.alice), ("admin", api.admin)):
        r = await api.client.get(f"/v1/sessions/{sid}/bundle", headers=api.auth(token))
        assert r.status_code == 200, (who, r.text)
        assert r.headers["content-type"] == "application/gzip"
        out = tmp_path / f"{who}.tar.gz"
        out.write_bytes(r.content)
        manifest = inspect_bundle(out)
        assert manifest["session_id"] == sid and manifest["counts"]["events"] > 0
        assert manifest["redactions"]["by_file"]["events.jsonl"]["namespace_env"] >= 1
        assert leaks(out, [canary, api.admin, api.alice, api.bob]) == []

    unknown = "ses_" + "f" * 32
    r_other = await api.client.get(f"/v1/sessions/{sid}/bundle", headers=api.auth(api.bob))
    r_unknown = await api.client.get(f"/v1/sessions/{unknown}/bundle", headers=api.auth(api.bob))
    assert r_other.status_code == r_unknown.status_code == 404
    assert r_other.json()["error"]["code"] == r_unknown.json()["error"]["code"] == "session_not_found"
    assert r_other.json()["error"]["message"].replace(sid, unknown) == r_unknown.json()["error"]["message"]
    r = await api.client.get(f"/v1/sessions/{sid}/bundle")
    assert r.status_code == 401
    assert not list((tmp_path / "data").glob(".bundle-*"))  # nothing staged is left in the data dir


async def test_an_operator_misconfiguration_is_not_shown_to_the_tenant(api: Api, tmp_path: Path) -> None:
    (tmp_path / "data" / "bundle-redact.txt").write_text("secret-shaped-(unclosed\n")
    session = await api.create_session(api.alice, "user:alice")
    r = await api.client.get(f"/v1/sessions/{session['session_id']}/bundle", headers=api.auth(api.alice))
    assert r.status_code == 500 and r.json()["error"]["code"] == "bundle_failed"
    assert "secret-shaped" not in r.text
    assert not list((tmp_path / "data").glob(".bundle-*"))


async def test_a_token_writes_one_bundle_at_a_time(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each bundle costs disk and CPU: a second request by the same token while its first is being written is a
    429 saying so; another token is not held up, and the first token gets its bundle (from the cache) once it is
    done."""
    from codesdk.supervisor import bundle

    writing, release = trio.Event(), trio.Event()
    real_build = bundle.BundleService.build

    async def held_build(*args: Any, **kwargs: Any) -> Any:
        writing.set()
        await release.wait()
        return await real_build(*args, **kwargs)

    monkeypatch.setattr(bundle.BundleService, "build", held_build)
    session = await api.create_session(api.alice, "user:alice")
    url = f"/v1/sessions/{session['session_id']}/bundle"
    answers: list[httpx.Response] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:

            async def first() -> None:
                answers.append(await api.client.get(url, headers=api.auth(api.alice)))

            nursery.start_soon(first)
            await writing.wait()
            again = await api.client.get(url, headers=api.auth(api.alice))
            assert again.status_code == 429 and again.json()["error"]["code"] == "bundle_in_progress"
            assert again.headers["retry-after"] == "1"
            monkeypatch.setattr(bundle.BundleService, "build", real_build)
            admin = await api.client.get(url, headers=api.auth(api.admin))  # another token is not held up
            assert admin.status_code == 200
            release.set()
        assert answers[0].status_code == 200
        assert (await api.client.get(url, headers=api.auth(api.alice))).status_code == 200
