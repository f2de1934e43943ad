"""Building a bundle for the API: off the supervisor's event loop, in a child process at the lowest CPU and IO
priority, bounded in size, and cached until the session changes.

Apart from the writer (``_archive``, which the child runs and ``codesdk bundle`` runs in its own process): this is
the part that knows bundles cost a service CPU and disk that its other tenants share. Redacting every string of a
long session is CPU-bound Python; in a thread it would hold the GIL against the event loop every tenant's requests
run on, so it runs in a child process (``_child``) that lowers its own priority first (``SCHED_IDLE``, nice 19, IO
class idle): the kernel gives it only what the supervisor and the workers leave. The child writes inside a work
directory of its own under ``<data-dir>/bundle-cache``, which the parent removes however the child ended (killed
included), so a failed build leaves nothing behind.

A finished bundle is kept in ``<data-dir>/bundle-cache`` under a key made of the session, its last seq, the size cap
and the redaction settings (a keyed hash: the file names reveal no secret): a request of a session that has not
changed since gets the same bytes at once. The cache is bounded in bytes (oldest used first out), holds one bundle
per session, and is emptied when the supervisor starts using it.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import hmac
import json
import math
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import trio

from ._collect import BundleSources
from ._format import FORMAT_VERSION, BundleError
from ._redact import Redactor

if TYPE_CHECKING:
    from ..engine import Engine

#: Where built bundles are kept, in the data dir.
CACHE_DIR = "bundle-cache"
#: The smallest size cap: below it a bundle would hold too little to diagnose anything.
MIN_MAX_BYTES = 64 << 10
#: What of the child's stderr a failure reports.
_STDERR_TAIL = 2000


@dataclass(frozen=True)
class BundleLimits:
    """What support bundles may cost a service (``codesdk-supervisor serve --bundle-*``; docs/operations.md)."""

    #: The most a bundle's events and blobs may take, uncompressed; past it the bundle is truncated and says so.
    max_bytes: int = 256 << 20
    #: Seconds a token waits after a bundle was built for it before another is built for it (429 + Retry-After);
    #: a bundle still in the cache is served at any time.
    min_interval_s: float = 60.0
    #: Bytes of built bundles kept on disk for reuse (0: none kept).
    cache_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        if self.max_bytes < MIN_MAX_BYTES:
            raise ValueError(f"the bundle size cap must be at least {MIN_MAX_BYTES >> 10} KiB")
        if self.min_interval_s < 0 or self.cache_bytes < 0:
            raise ValueError("the bundle interval and cache size must be >= 0")


class BundleCache:
    """Built bundles in ``<data-dir>/bundle-cache``, one per session, at most ``max_bytes`` in all."""

    def __init__(self, data_dir: Path, max_bytes: int) -> None:
        self.root = Path(data_dir) / CACHE_DIR
        self.max_bytes = max_bytes
        self._key = secrets.token_bytes(32)  # per process: the cache is emptied when a supervisor starts using it
        self._ready = False

    def _prepare(self) -> None:
        if not self._ready:  # what an earlier process left (its bundles, a build it died during) is not ours
            shutil.rmtree(self.root, ignore_errors=True)
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._ready = True

    def key(self, sources: BundleSources, last_seq: int, max_bytes: int) -> str:
        settings = json.dumps([FORMAT_VERSION, sources.session_id, last_seq, max_bytes, sorted(sources.secrets.items()),
                               sources.patterns])
        return f"{sources.session_id}.{hmac.new(self._key, settings.encode(), hashlib.sha256).hexdigest()[:32]}"

    def work_dir(self) -> Path:
        """A fresh directory for one build (the caller removes it)."""
        self._prepare()
        return Path(tempfile.mkdtemp(prefix=".build-", dir=self.root))

    def get(self, key: str) -> Path | None:
        """The cached bundle of ``key`` (marked as just used), or None."""
        self._prepare()
        path = self.root / f"{key}.tar.gz"
        try:
            _touch(path)
        except FileNotFoundError:
            return None
        return path

    def put(self, key: str, built: Path) -> Path | None:
        """Keep ``built`` as ``key``'s bundle (moved into the cache) and drop what no longer fits; None when it is
        not kept (larger than the whole cache)."""
        self._prepare()
        session = key.partition(".")[0]
        size = built.stat().st_size
        if size > self.max_bytes:
            return None
        for old in self.root.glob(f"{session}.*.tar.gz"):  # an older bundle of the session: never served again
            old.unlink(missing_ok=True)
        path = self.root / f"{key}.tar.gz"
        os.replace(built, path)
        _touch(path)
        entries = []
        for entry in self.root.glob("*.tar.gz"):
            with contextlib.suppress(FileNotFoundError):
                stat = entry.stat()
                entries.append((stat.st_mtime_ns, stat.st_size, entry))
        total = sum(size for _, size, _ in entries)
        for _, size, entry in sorted(entries, key=lambda e: e[0]):  # oldest used first
            if total <= self.max_bytes:
                break
            if entry != path:
                entry.unlink(missing_ok=True)
                total -= size
        return path


    def forget(self, session_id: str) -> None:
        """Drop the session's bundle (it was deleted: nothing of it stays on disk)."""
        if self.root.is_dir():
            for old in self.root.glob(f"{glob.escape(session_id)}.*.tar.gz"):
                old.unlink(missing_ok=True)


def _touch(path: Path) -> None:
    now = time.time_ns()  # not the file system's coarser clock: the order of use is what eviction goes by
    os.utime(path, ns=(now, now))


def _spec(sources: BundleSources, store: dict[str, Any], out: Path, through_seq: int, max_bytes: int) -> bytes:
    return json.dumps({"store": store, "session_id": sources.session_id, "secrets": sources.secrets,
                       "patterns": sources.patterns, "environment": sources.environment, "config": sources.config,
                       "workers": sources.workers, "health": sources.health, "out": str(out),
                       "through_seq": through_seq, "max_bytes": max_bytes}, default=str).encode()


async def build_in_child(sources: BundleSources, store: dict[str, Any], out: Path, *, through_seq: int,
                         max_bytes: int, on_started: Callable[[int], Awaitable[None]] | None = None) -> None:
    """Write the bundle to ``out`` in a child process at the lowest priority, reading the store ``store`` names
    (``{"sqlite": data_dir}`` or ``{"postgres": url}``) on its own; ``out``'s directory is the child's to write in
    (its stderr goes there too). ``on_started(pid)``: awaited once the child runs, before it is told what to build.
    ``BundleError`` if it fails (with its stderr's tail, for the operator's log). Cancelled, the child is killed."""
    Redactor(sources.secrets, sources.patterns)  # a bad operator pattern: refused here, with its own message
    spec = _spec(sources, store, out, through_seq, max_bytes)
    command = [sys.executable, "-m", "codesdk.supervisor.bundle._child"]
    stderr_path = out.parent / "stderr.txt"
    with stderr_path.open("wb") as stderr:
        async with trio.open_nursery() as nursery:
            process: trio.Process = await nursery.start(partial(
                trio.run_process, command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stderr,
                check=False))
            if on_started is not None:
                await on_started(process.pid)
            assert process.stdin is not None
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):  # it died: its status says
                await process.stdin.send_all(spec)
            await process.stdin.aclose()
    if process.returncode != 0:
        tail = stderr_path.read_bytes()[-_STDERR_TAIL:].decode(errors="replace").strip().splitlines()
        raise BundleError(f"the bundle process failed (exit status {process.returncode})"
                          + (f": {tail[-1]}" if tail else ""))


class BundleRefused(Exception):
    """A bundle not built now (429): ``code`` says why, ``retry_after_s`` when to ask again."""

    def __init__(self, code: str, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.code, self.retry_after_s = code, retry_after_s


class BundleService:
    """Bundles for the API's tokens: one build per token at a time, at most one per ``min_interval_s`` for each,
    each built in a child process (``build_in_child``) and kept in the cache until its session changes."""

    def __init__(self, engine: Engine, limits: BundleLimits | None = None) -> None:
        self.engine = engine
        self.limits = limits or BundleLimits()
        self.cache = BundleCache(Path(engine.config.data_dir), self.limits.cache_bytes)
        self._building: set[str] = set()
        self._built_at: dict[str, float] = {}  # token -> when its last build ended (trio clock)
        #: Builds run and cache hits served, since start (for tests and metrics).
        self.builds = 0
        self.hits = 0
        url = engine.config.store
        #: The store as the child opens it.
        self.store_spec: dict[str, Any] = {"postgres": url} if url else {"sqlite": str(engine.config.data_dir)}

    async def build(self, sources: BundleSources, out: Path, through_seq: int) -> None:
        """Write one bundle to ``out`` (``build_in_child``)."""
        await build_in_child(sources, self.store_spec, out, through_seq=through_seq, max_bytes=self.limits.max_bytes)

    async def open(self, principal: str, session_id: str) -> IO[bytes]:
        """The session's bundle, open for reading (cached, or built now). ``BundleRefused`` (429) while this
        principal's other bundle is being built or within its interval; ``BundleError`` if the build failed;
        ``UnknownSession`` from the store."""
        from ._collect import sources_from_engine

        sources = await sources_from_engine(self.engine, session_id)
        last_seq = await self.engine.store.last_seq(session_id)
        key = self.cache.key(sources, last_seq, self.limits.max_bytes)
        cached = await trio.to_thread.run_sync(self._open_cached, key)
        if cached is not None:
            self.hits += 1
            return cached
        if principal in self._building:  # each costs disk and CPU: one at a time per token
            raise BundleRefused("bundle_in_progress", "this token is already writing a bundle; try again when it is "
                                                      "done", 1)
        wait = self._built_at.get(principal, -math.inf) + self.limits.min_interval_s - trio.current_time()
        if wait > 0:
            raise BundleRefused("bundle_too_soon", f"this token had a bundle built less than "
                                f"{self.limits.min_interval_s:g} s ago; try again in {math.ceil(wait)} s (an "
                                "unchanged session's bundle is served at any time)", math.ceil(wait))
        self._building.add(principal)
        work = await trio.to_thread.run_sync(self.cache.work_dir)
        try:
            out = work / "bundle.tar.gz"
            self.builds += 1
            try:
                await self.build(sources, out, last_seq)
            except BundleError:
                raise  # the build failed (not the tenant's doing): asking again is not held off
            except BaseException:  # cancelled (the client went away): what it cost counts as a build
                self._built_at[principal] = trio.current_time()
                raise
            self._built_at[principal] = trio.current_time()
            return await trio.to_thread.run_sync(self._keep, key, out)
        finally:  # however the build ended (the child killed included): nothing of it stays but the kept bundle
            self._building.discard(principal)
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(shutil.rmtree, work, True)

    def _open_cached(self, key: str) -> IO[bytes] | None:
        path = self.cache.get(key)
        if path is None:
            return None
        try:
            return path.open("rb")
        except FileNotFoundError:  # evicted meanwhile
            return None

    def _keep(self, key: str, out: Path) -> IO[bytes]:
        handle = out.open("rb")  # open before it moves: served even if the cache does not keep it
        self.cache.put(key, out)
        return handle
