"""Writing a bundle: the session's events a page at a time and the blobs they name, redacted, staged next to the
output and hashed as they go, then one ``.tar.gz`` (manifest first) written to a temp file and renamed into place.

Apart from the reader (``_inspect``) and the gathering (``_collect``): this is the part that touches the disk, and
it must leave either the whole archive or nothing (``atomic_output``, also used for a bundle downloaded from a
service).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tarfile
import tempfile
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import trio

from codesdk.protocol import HASH_PREFIX, NormalizedEvent, named_blobs

from ..store import BlobNotFound
from ._collect import BundleSources, codesdk_version
from ._format import FORMAT, FORMAT_VERSION, MANIFEST, BundleError
from ._redact import Redactor

#: Events read (and redacted) at a time: what the writer holds in memory of a session's events.
EVENT_PAGE = 500


@dataclass(frozen=True)
class _Line:
    """One redacted event line of ``events.jsonl``, with what the manifest counts of it (not the parsed event)."""

    seq: int
    type: str
    refs: tuple[str, ...]
    data: bytes


class _Staging:
    """Files being staged for the archive, each hashed as it is written."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: dict[str, dict[str, Any]] = {}

    def put(self, name: str, data: bytes) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_bytes(data)
        self.files[name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}

    def put_json(self, name: str, value: Any) -> None:
        self.put(name, (json.dumps(value, indent=1, ensure_ascii=False, default=str) + "\n").encode())


def _json_line(value: Any) -> bytes:
    return (json.dumps(value, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def _blob_content(data: bytes, name: str, redactor: Redactor) -> tuple[bytes | None, str]:
    """(what to archive, how it was treated): JSON redacted value by value, text as text, binary left out."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, "binary"
    try:
        value = json.loads(text)
    except ValueError:
        return redactor.text(text, name).encode(), "text"
    return json.dumps(redactor.json(value, name), ensure_ascii=False, separators=(",", ":")).encode(), "json"


def check_output(out: Path, force: bool) -> None:
    """``BundleError`` unless ``out`` can be written (it exists: only with ``force``)."""
    if out.is_dir():
        raise BundleError(f"{out} is a directory; give a file name with -o")
    if out.exists() and not force:
        raise BundleError(f"{out} exists; pass --force to overwrite it")
    if not out.parent.is_dir():
        raise BundleError(f"cannot write {out}: directory {out.parent} does not exist")
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise BundleError(f"cannot write {out}: directory {out.parent} is not writable")


async def write_bundle(sources: BundleSources, out: Path, *, force: bool = False, through_seq: int | None = None,
                       max_bytes: int | None = None) -> dict[str, Any]:
    """Write the bundle to ``out`` (atomically: all of it, or nothing and ``out`` untouched); return its manifest.

    ``through_seq``: the session's events up to this seq only (what a cached bundle is keyed on). ``max_bytes``:
    the most the events and blobs may take, uncompressed; past it the session's first and last events are kept
    (half the cap each) and those between left out, blobs that do not fit are left out, and the manifest's
    ``truncated`` says so (None when nothing was cut).

    ``BundleError`` for an output that can't be written (exists without ``force``, no such directory, not
    writable)."""
    out = Path(out)
    check_output(out, force)
    redactor = Redactor(sources.secrets, sources.patterns)
    store = sources.store
    try:
        staging_dir = tempfile.mkdtemp(prefix=".codesdk-bundle-", dir=out.parent)
    except OSError as exc:
        raise BundleError(f"cannot write {out}: {exc.strerror or exc}") from None
    try:
        staging = _Staging(Path(staging_dir))
        refs: dict[str, None] = {}
        counts: Counter[str] = Counter()
        events_path = staging.root / "events.jsonl"
        cap = max_bytes if max_bytes is not None else float("inf")
        # Over the cap, the bundle keeps the session's start (its creation, the first tasks), written as it is read,
        # and its end (where a failure is), held in a rolling window of at most the rest of the cap: half each.
        head_room = cap / 2
        tail: deque[_Line] = deque()
        tail_size = 0
        left_out = 0
        head_last = 0
        digest = hashlib.sha256()
        size = 0
        last_written = 0

        def keep(line: _Line) -> None:
            nonlocal size, last_written
            refs.update(dict.fromkeys(line.refs))
            counts[line.type] += 1
            last_written = line.seq
            digest.update(line.data)
            size += len(line.data)

        with events_path.open("wb") as handle:
            after = 0
            while True:
                page = await store.read(sources.session_id, after_seq=after, limit=EVENT_PAGE)
                if through_seq is not None:
                    page = [event for event in page if event.seq <= through_seq]
                if not page:
                    break
                objs = [event.to_json_obj() for event in page]

                def redact_page(objs: list[dict[str, Any]] = objs, page: list[NormalizedEvent] = page) -> list[_Line]:
                    return [_Line(int(obj.get("seq", 0)), str(obj.get("type")), named_blobs(event),
                                  _json_line(redactor.json(obj, "events.jsonl"))) for event, obj in zip(page, objs)]

                lines = await trio.to_thread.run_sync(redact_page)  # CPU: not on the loop other tenants share
                head: list[_Line] = []
                for line in lines:
                    if not tail and size + len(line.data) <= head_room:
                        head.append(line)
                        keep(line)
                        head_last = line.seq
                        continue
                    tail.append(line)
                    tail_size += len(line.data)
                    while tail and size + tail_size > cap:
                        tail_size -= len(tail.popleft().data)
                        left_out += 1
                if head:
                    await trio.to_thread.run_sync(handle.write, b"".join(line.data for line in head))
                after = page[-1].seq
            for line in tail:
                keep(line)
            await trio.to_thread.run_sync(handle.write, b"".join(line.data for line in tail))
        truncated: dict[str, Any] | None = None
        if left_out:
            truncated = {"events_through_seq": head_last, "events_from_seq": tail[0].seq if tail else None,
                         "events_left_out": left_out, "max_bytes": max_bytes,
                         "why": "the session's events are larger than the bundle's size cap: its start (through "
                                "events_through_seq) and its end (from events_from_seq) are here, the "
                                "events_left_out between them are not"}
        tail.clear()
        staging.files["events.jsonl"] = {"sha256": digest.hexdigest(), "size": size}

        blobs: list[dict[str, Any]] = []
        for ref in refs:
            hex_digest = ref[len(HASH_PREFIX):]
            name = f"blobs/{hex_digest}"
            try:
                data = await store.get_blob(ref)
            except BlobNotFound:
                blobs.append({"ref": ref, "included": False, "why": "not in the blob store"})
                continue
            content, how = await trio.to_thread.run_sync(_blob_content, data, name, redactor)
            if content is None:
                blobs.append({"ref": ref, "included": False, "size": len(data),
                              "why": "binary: left out, since no pattern can prove binary bytes hold no secret"})
                continue
            if size + len(content) > cap:
                blobs.append({"ref": ref, "included": False, "size": len(data),
                              "why": "left out: it does not fit under the bundle's size cap"})
                truncated = truncated or {"events_through_seq": last_written, "max_bytes": max_bytes,
                                          "why": "blobs larger than the bundle's size cap are left out"}
                continue
            size += len(content)
            await trio.to_thread.run_sync(staging.put, name, content)
            blobs.append({"ref": ref, "included": True, "as": how, "redacted": bool(redactor.counts.get(name))})

        for name, value in (("environment.json", sources.environment), ("config.json", sources.config),
                            ("workers.json", sources.workers), ("health.json", sources.health)):
            # through JSON first: whatever the values are, what is redacted is exactly what is written
            plain = json.loads(json.dumps(value, default=str))
            staging.put_json(name, redactor.json(plain, name))

        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "codesdk_version": codesdk_version(), "session_id": sources.session_id,
            "counts": {"events": sum(counts.values()), "event_types": dict(sorted(counts.items())),
                       "blobs_named": len(refs), "blobs_included": sum(1 for b in blobs if b["included"])},
            "blobs": blobs,
            "truncated": truncated,
            "files": dict(sorted(staging.files.items())),
            "redactions": {"placeholder": "[REDACTED:<kind>]", "by_file": redactor.report(),
                           "operator_patterns": len(sources.patterns),
                           "values_known": dict(Counter(sources.secrets.values()))},
        }
        manifest_bytes = (json.dumps(manifest, indent=1, ensure_ascii=False) + "\n").encode()
        await trio.to_thread.run_sync(_write_archive, staging, manifest_bytes, out)
        return manifest
    finally:
        await trio.to_thread.run_sync(_remove_tree, Path(staging_dir))


def _remove_tree(root: Path) -> None:
    import shutil

    shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def atomic_output(out: Path) -> Iterator[IO[bytes]]:
    """A temp file beside ``out`` (0600) that becomes ``out`` once the block succeeds; removed if it fails."""
    fd, temp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        with open(temp, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, out)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _write_archive(staging: _Staging, manifest: bytes, out: Path) -> None:
    with atomic_output(out) as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        _add(tar, MANIFEST, io.BytesIO(manifest), len(manifest))
        for name, info in staging.files.items():
            with (staging.root / name).open("rb") as handle:
                _add(tar, name, handle, int(info["size"]))


def _add(tar: tarfile.TarFile, name: str, handle: IO[bytes], size: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o600
    info.mtime = int(datetime.now(UTC).timestamp())
    tar.addfile(info, handle)
