"""Blob store: content addressing, idempotence, canonical JSON refs, corruption detection.

The tests that take ``recorder`` or ``backend`` are part of the recorder contract (run against each backend); the
others look at the SQLite store's files and rows."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest
import trio

from codesdk.protocol import CanonicalizationError, EventType, RuntimeInfo, canonical_hash, sha256_hex
from codesdk.supervisor.store import (
    DB_FILENAME,
    INLINE_BLOB_MAX,
    BlobCorrupt,
    BlobNotFound,
    EventDraft,
    EventStore,
    InvalidBlobRef,
    Recorder,
)

from tests.store.backends import Backend


def _blob_files(data_dir: Path) -> list[Path]:
    return sorted(p for p in (data_dir / "blobs").rglob("*") if p.is_file())


async def test_round_trip_and_layout(store: EventStore, data_dir: Path) -> None:
    with trio.fail_after(10):
        data = b"\x00binary\xffdata" * 100
        ref = await store.put_blob(data, "application/x-test")
        assert ref == sha256_hex(data)
        digest = ref.removeprefix("sha256:")
        assert _blob_files(data_dir) == [data_dir / "blobs" / "sha256" / digest[:2] / digest[2:]]
        assert await store.get_blob(ref) == data
        assert await store.blob_exists(ref)
        info = await store.blob_info(ref)
        assert (info.size, info.media_type) == (len(data), "application/x-test")


async def test_put_is_idempotent_and_deduplicated(store: EventStore, data_dir: Path) -> None:
    with trio.fail_after(10):
        refs = set()
        async with trio.open_nursery() as nursery:
            async def put(media_type: str) -> None:
                refs.add(await store.put_blob(b"same bytes", media_type))

            for index in range(10):
                nursery.start_soon(put, f"text/x-{index}")
        assert len(refs) == 1
        assert len(_blob_files(data_dir)) == 1  # and no temp files left behind
        assert (await store.blob_info(refs.pop())).media_type.startswith("text/x-")
        assert await store.put_blob(b"") == sha256_hex(b"")
        assert await store.get_blob(sha256_hex(b"")) == b""


async def test_json_blob_ref_is_the_canonical_hash(recorder: Recorder) -> None:
    with trio.fail_after(10):
        value = {"b": [1, 2.5, "é"], "a": {"z": None, "y": True}}
        ref = await recorder.put_json_blob(value)
        assert ref == canonical_hash(value)
        assert ref == await recorder.put_json_blob({"a": {"y": True, "z": None}, "b": [1, 2.5, "é"]})
        assert await recorder.get_blob(ref) == b'{"a":{"y":true,"z":null},"b":[1,2.5,"\xc3\xa9"]}'
        assert (await recorder.blob_info(ref)).media_type == "application/json"
        with pytest.raises(CanonicalizationError, match="/x"):
            await recorder.put_json_blob({"x": float("nan")})


async def test_unknown_and_malformed_refs(recorder: Recorder) -> None:
    with trio.fail_after(10):
        missing = sha256_hex(b"never stored")
        with pytest.raises(BlobNotFound, match=missing):
            await recorder.get_blob(missing)
        with pytest.raises(BlobNotFound):
            await recorder.blob_info(missing)
        assert not await recorder.blob_exists(missing)
        for bad in ("sha256:abc", "md5:" + "0" * 64, "sha256:" + "G" * 64, "sha256:../../etc/passwd"):
            with pytest.raises(InvalidBlobRef, match="64 lowercase hex"):
                await recorder.get_blob(bad)
            with pytest.raises(InvalidBlobRef):
                await recorder.blob_exists(bad)
        with pytest.raises(TypeError, match="bytes"):
            await recorder.put_blob("text")  # type: ignore[arg-type]


async def test_corruption_is_detected(store: EventStore, data_dir: Path) -> None:
    with trio.fail_after(10):
        ref = await store.put_blob(b"precious", "text/plain")
        [path] = _blob_files(data_dir)
        path.write_bytes(b"tampered")
        with pytest.raises(BlobCorrupt, match=f"{ref} is corrupt.*{sha256_hex(b'tampered')}"):
            await store.get_blob(ref)
        path.unlink()
        assert await store.put_blob(b"precious") == ref  # a deleted blob can be written again
        assert await store.get_blob(ref) == b"precious"


async def test_blob_file_without_metadata_row(store: EventStore, data_dir: Path) -> None:
    with trio.fail_after(10):
        data = b"written before a crash"
        ref = sha256_hex(data)
        digest = ref.removeprefix("sha256:")
        path = data_dir / "blobs" / "sha256" / digest[:2] / digest[2:]
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
        info = await store.blob_info(ref)
        assert (info.size, info.media_type) == (len(data), "application/octet-stream")
        assert await store.put_blob(data, "text/plain") == ref  # repairs the missing row
        assert (await store.blob_info(ref)).media_type == "text/plain"


# -- small blobs committed with the events that name them ------------------------------------------


def _named(ref: str) -> EventDraft:
    return EventDraft(type=EventType.SESSION_CREATED, runtime=RuntimeInfo(name="scripted"),
                      payload={"contract_version": "1.0", "runtime": "scripted", "namespace": "default",
                               "metadata": {"blob": ref}})


async def test_inline_blobs_commit_with_their_events_and_read_back_verified(data_dir: Path) -> None:
    data = b'{"result":"small"}'
    ref = sha256_hex(data)
    async with EventStore.open(data_dir) as store:
        sid = (await store.create_session(runtime="scripted", namespace="default")).session_id
        await store.append(sid, [_named(ref)], blobs={ref: (data, "application/json")})
        assert await store.get_blob(ref) == data and await store.blob_exists(ref)
        assert (await store.blob_info(ref)).media_type == "application/json"
        assert _blob_files(data_dir) == []  # no file, no extra fsyncs
        file_ref = await store.put_blob(data, "text/plain")  # the same bytes later as a file: one blob
        assert file_ref == ref and await store.get_blob(ref) == data
    async with EventStore.open(data_dir) as store:  # durable with the events
        assert await store.get_blob(ref) == data


async def test_bad_inline_blobs_store_nothing(backend: Backend) -> None:
    async with backend.open() as store:
        sid = (await store.create_session(runtime="scripted", namespace="default")).session_id
        wrong = sha256_hex(b"other")
        with pytest.raises(ValueError, match="does not match its bytes"):
            await store.append(sid, [_named(wrong)], blobs={wrong: (b"these", "text/plain")})
        big = b"x" * (INLINE_BLOB_MAX + 1)
        with pytest.raises(ValueError, match="go through put_blob"):
            await store.append(sid, [_named(sha256_hex(big))], blobs={sha256_hex(big): (big, "text/plain")})
        assert await store.last_seq(sid) == 0
        assert not await store.blob_exists(wrong)


async def test_a_tampered_inline_blob_is_detected(data_dir: Path) -> None:
    data = b"trusted"
    ref = sha256_hex(data)
    async with EventStore.open(data_dir) as store:
        sid = (await store.create_session(runtime="scripted", namespace="default")).session_id
        await store.append(sid, [_named(ref)], blobs={ref: (data, "text/plain")})
    conn = apsw.Connection(str(data_dir / DB_FILENAME))
    conn.execute("UPDATE blobs SET content = ? WHERE ref = ?", (b"tampered", ref))
    conn.close()
    async with EventStore.open(data_dir) as store:
        with pytest.raises(BlobCorrupt, match="table blobs"):
            await store.get_blob(ref)


async def test_a_session_names_a_blob_only_in_a_ref_field_of_its_own_events(backend: Backend) -> None:
    """``names_blob``: what the session's readers may download. Text that merely contains the ref — here a
    session's metadata — does not name it, nor does another session's event."""
    data = b'{"result":"mine"}'
    ref = sha256_hex(data)
    other = sha256_hex(b"someone else's")
    async with backend.open() as store:
        sid = (await store.create_session(runtime="scripted", namespace="default")).session_id
        elsewhere = (await store.create_session(runtime="scripted", namespace="default")).session_id
        await store.append(sid, [_named(other)])  # the ref as text only (metadata)
        await store.append(sid, [EventDraft(type=EventType.MODEL_OUTPUT_DELTA, runtime=RuntimeInfo(
            name="scripted", raw_ref=ref), payload={"block_id": "b", "delta": f"see {other}"})],
            blobs={ref: (data, "application/json")})
        assert await store.names_blob(sid, ref)
        assert not await store.names_blob(sid, other)
        assert not await store.names_blob(elsewhere, ref)
        with pytest.raises(InvalidBlobRef):
            await store.names_blob(sid, "sha256:zz")
