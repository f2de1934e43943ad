"""Support bundles bounded (issue 34): built in a child process off the supervisor's loop, cut at a size cap, one per
token at a time and at most one per interval, cached until the session changes, and nothing left of a killed build."""

from __future__ import annotations

import json
import os
import signal
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx2 as httpx
import psutil
import pytest
import trio

from codesdk.supervisor import bundle
from codesdk.supervisor.api import ApiLimits

from tests.api.conftest import Api, serve_test_api
from tests.bundle.conftest import members
from tests.conftest import MakeEngine


def api_with(make_engine: MakeEngine, tmp_path: Path,
             limits: bundle.BundleLimits) -> AbstractAsyncContextManager[Api]:
    """The API fixture's service, with these bundle limits."""
    return serve_test_api(make_engine, tmp_path, ApiLimits(bundles=limits))


async def _flood(api: Api, session_id: str, n: int, delta: str) -> None:
    scenario = {"name": "flood", "steps": [{"flood": n, "delta": delta}, {"complete": {}}]}
    task = await api.engine.start_task(session_id, "flood", runtime_config={"scenario_inline": scenario})
    record = await api.engine.wait_task(task.task_id)
    assert record.state == "completed", record


def _leftovers(data_dir: Path) -> list[str]:
    """What a build may have left in the data dir: staging, temp files, work dirs."""
    cache = data_dir / bundle.CACHE_DIR
    found = [p.name for p in data_dir.glob(".*bundle*")]
    if cache.exists():
        found += [p.name for p in cache.iterdir() if p.name.startswith(".") or not p.name.endswith(".tar.gz")]
    return found


async def _bundle(api: Api, token: str, session_id: str) -> httpx.Response:
    return await api.client.get(f"/v1/sessions/{session_id}/bundle", headers=api.auth(token))


async def test_the_bundle_is_built_in_another_process_while_the_loop_serves(
        make_engine: MakeEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The redaction never runs in the supervisor's process (a Redactor used here would fail the bundle), and while
    the bundle process is held stopped the supervisor answers another request, then the bundle arrives."""
    stopped: list[int] = []
    held = trio.Event()

    async def stop_it(pid: int) -> None:
        proc = psutil.Process(pid)
        assert proc.ppid() == os.getpid()  # the supervisor's own child (not yet past its exec, maybe)
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)
        held.set()

    async def held_build(self: bundle.BundleService, sources: bundle.BundleSources, out: Path,
                         through_seq: int) -> None:
        await bundle.build_in_child(sources, self.store_spec, out, through_seq=through_seq,
                                    max_bytes=self.limits.max_bytes, on_started=stop_it)

    def not_here(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a bundle was redacted in the supervisor's process")

    async with api_with(make_engine, tmp_path, bundle.BundleLimits()) as api:
        session = await api.create_session(api.alice, "user:alice")
        sid = session["session_id"]
        await api.engine.wait_task((await api.run_task(api.alice, sid))["task_id"])
        monkeypatch.setattr(bundle.BundleService, "build", held_build)
        monkeypatch.setattr(bundle.Redactor, "text", not_here)
        monkeypatch.setattr(bundle.Redactor, "json", not_here)
        answers: list[httpx.Response] = []
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:

                async def ask() -> None:
                    answers.append(await _bundle(api, api.alice, sid))

                nursery.start_soon(ask)
                await held.wait()
                while psutil.Process(stopped[0]).status() != psutil.STATUS_STOPPED:  # the signal is on its way
                    await trio.sleep(0.01)
                other = await api.client.get(f"/v1/sessions/{sid}/events", headers=api.auth(api.bob))
                mine = await api.client.get(f"/v1/sessions/{sid}", headers=api.auth(api.alice))
                assert other.status_code == 404 and mine.status_code == 200  # served while the bundle is held
                assert answers == []  # ... and the bundle is still being built
                os.kill(stopped[0], signal.SIGCONT)
        assert answers[0].status_code == 200, answers[0].text
        out = tmp_path / "b.tar.gz"
        out.write_bytes(answers[0].content)
        assert bundle.inspect_bundle(out)["session_id"] == sid
        assert _leftovers(tmp_path / "data") == []


async def test_a_session_over_the_size_cap_gives_a_bundle_cut_short_that_says_so(
        make_engine: MakeEngine, tmp_path: Path) -> None:
    cap = bundle.MIN_MAX_BYTES
    async with api_with(make_engine, tmp_path, bundle.BundleLimits(max_bytes=cap, min_interval_s=0)) as api:
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        await _flood(api, sid, 2_000, "d" * 64)  # ~0.5 MB of events: many times the cap
        last_seq = await api.engine.store.last_seq(sid)
        r = await _bundle(api, api.alice, sid)
        assert r.status_code == 200, r.text
        out = tmp_path / "cut.tar.gz"
        out.write_bytes(r.content)
        manifest = bundle.inspect_bundle(out)  # whole and consistent, however short
        truncated = manifest["truncated"]
        assert truncated["max_bytes"] == cap
        assert 0 < truncated["events_through_seq"] < truncated["events_from_seq"] <= last_seq, truncated
        events = members(out)["events.jsonl"].splitlines()
        assert len(events) == manifest["counts"]["events"] == last_seq - truncated["events_left_out"]
        assert len(members(out)["events.jsonl"]) <= cap
        seqs = [json.loads(line)["seq"] for line in events]
        # the session's start (its creation) and its end (where a failure would be) are both there, in order
        assert seqs[0] == 1 and seqs[-1] == last_seq and seqs == sorted(seqs), (seqs[:3], seqs[-3:])
        start = seqs.index(truncated["events_through_seq"])
        assert seqs[start + 1] == truncated["events_from_seq"]
        assert seqs == [*range(1, seqs[start] + 1), *range(truncated["events_from_seq"], last_seq + 1)]
        assert any(line.startswith("TRUNCATED") for line in bundle.summary_lines(manifest))

        small = (await api.create_session(api.alice, "user:alice"))["session_id"]
        r = await _bundle(api, api.alice, small)
        out.write_bytes(r.content)
        assert r.status_code == 200 and bundle.inspect_bundle(out)["truncated"] is None


async def test_a_token_waits_the_interval_between_builds_but_gets_a_cached_bundle_at_once(
        make_engine: MakeEngine, tmp_path: Path) -> None:
    interval = 3600.0
    async with api_with(make_engine, tmp_path, bundle.BundleLimits(min_interval_s=interval)) as api:
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        await api.engine.wait_task((await api.run_task(api.alice, sid))["task_id"])
        first = await _bundle(api, api.alice, sid)
        assert first.status_code == 200, first.text
        again = await _bundle(api, api.alice, sid)  # unchanged: the cached bytes, not a build (which would be 429)
        assert again.status_code == 200 and again.content == first.content

        await api.engine.wait_task((await api.run_task(api.alice, sid))["task_id"])  # the session changed
        soon = await _bundle(api, api.alice, sid)
        assert soon.status_code == 429, soon.text
        error = soon.json()["error"]
        assert error["code"] == "bundle_too_soon"
        retry_after = int(soon.headers["retry-after"])
        assert 0 < retry_after <= interval and f"{retry_after} s" in error["message"]
        admin = await _bundle(api, api.admin, sid)  # another token's interval is its own
        assert admin.status_code == 200 and admin.content != first.content


async def test_the_cache_returns_the_same_bytes_until_the_session_changes(
        make_engine: MakeEngine, tmp_path: Path) -> None:
    async with api_with(make_engine, tmp_path, bundle.BundleLimits(min_interval_s=0)) as api:
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        await api.engine.wait_task((await api.run_task(api.alice, sid))["task_id"])
        first = await _bundle(api, api.alice, sid)
        second = await _bundle(api, api.alice, sid)
        assert first.status_code == second.status_code == 200
        assert second.content == first.content
        cache = tmp_path / "data" / bundle.CACHE_DIR
        assert [p.name.split(".")[0] for p in cache.glob("*.tar.gz")] == [sid]

        await api.engine.wait_task((await api.run_task(api.alice, sid))["task_id"])
        third = await _bundle(api, api.alice, sid)
        assert third.status_code == 200 and third.content != first.content
        counts = []
        for n, r in enumerate((first, third)):
            out = tmp_path / f"{n}.tar.gz"
            out.write_bytes(r.content)
            counts.append(bundle.inspect_bundle(out)["counts"]["events"])
        assert counts[1] > counts[0]
        assert len(list(cache.glob(f"{sid}.*"))) == 1  # the stale one is gone
        assert _leftovers(tmp_path / "data") == []


async def test_a_killed_bundle_process_leaves_nothing_and_the_next_request_works(
        make_engine: MakeEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    killed: list[int] = []

    async def kill_it(pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    real_build = bundle.BundleService.build

    async def killed_build(self: bundle.BundleService, sources: bundle.BundleSources, out: Path,
                           through_seq: int) -> None:
        (out.parent / "partial.tmp").write_bytes(b"x" * 1000)  # what a child dying mid-way leaves in its work dir
        await bundle.build_in_child(sources, self.store_spec, out, through_seq=through_seq,
                                    max_bytes=self.limits.max_bytes, on_started=kill_it)

    async with api_with(make_engine, tmp_path, bundle.BundleLimits()) as api:
        sid = (await api.create_session(api.alice, "user:alice"))["session_id"]
        monkeypatch.setattr(bundle.BundleService, "build", killed_build)
        r = await _bundle(api, api.alice, sid)
        assert r.status_code == 500 and r.json()["error"]["code"] == "bundle_failed", r.text
        assert killed and not psutil.pid_exists(killed[0]) or psutil.Process(killed[0]).status() == "zombie"
        assert _leftovers(tmp_path / "data") == []
        monkeypatch.setattr(bundle.BundleService, "build", real_build)
        r = await _bundle(api, api.alice, sid)  # a failed build does not hold the token off
        assert r.status_code == 200, r.text


def test_the_cache_stays_within_its_bytes(tmp_path: Path) -> None:
    cache = bundle.BundleCache(tmp_path, max_bytes=2500)
    kept = []
    for n in range(4):
        work = cache.work_dir()
        built = work / "bundle.tar.gz"
        built.write_bytes(bytes(1000))
        kept.append(cache.put(f"ses_{n}.k{n}", built))
    files = sorted(p.name for p in cache.root.glob("*.tar.gz"))
    assert files == ["ses_2.k2.tar.gz", "ses_3.k3.tar.gz"]  # the oldest used went first
    too_big = cache.work_dir() / "bundle.tar.gz"
    too_big.write_bytes(bytes(3000))
    assert cache.put("ses_9.k9", too_big) is None  # larger than the whole cache: served, not kept
    assert cache.get("ses_3.k3") is not None and cache.get("ses_0.k0") is None
