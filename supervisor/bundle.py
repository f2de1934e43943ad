"""Support bundles: one ``.tar.gz`` with what is needed to diagnose one session, secrets redacted.

One writer (``write_bundle``) serves ``codesdk bundle`` (embedded supervisor) and the API route
``GET /v1/sessions/{id}/bundle``; ``inspect_bundle`` reads one back (``codesdk bundle --inspect``).

The archive holds ``manifest.json`` (first), ``events.jsonl``, ``blobs/<sha256 hex>``, ``environment.json``,
``config.json``, ``workers.json`` and ``health.json``. Every string that goes in passes the ``Redactor``: the
namespace's stored variable values, the admin token, anything shaped like a key or token, and the operator's own
patterns (``<data-dir>/bundle-redact.txt``, one regex a line, and ``codesdk bundle --redact``) become
``[REDACTED:<kind>]``; the manifest counts what was redacted per file and kind, never a value. JSON (events, JSON
blobs) is redacted value by value, not as text, so no escaping can hide a secret from a pattern. Binary blobs are
left out, listed in the manifest: no pattern can prove that compressed or encoded bytes hold no secret.

Memory stays bounded: events are read a page at a time and written to a staging directory (0700, next to the
output) while they are hashed; the archive is written to a temp file in the output's directory and renamed into
place, so a failure never leaves a half archive behind.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import math
import os
import platform
import re
import sys
import tarfile
import tempfile
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import trio

from codesdk.protocol import HASH_PREFIX, is_hash

from .config import ADMIN_TOKEN_FILE
from .namespaces._variables import NamespaceEnv
from .store import BlobNotFound, StoreReader

if TYPE_CHECKING:
    from .engine import Engine

FORMAT = "codesdk-support-bundle"
FORMAT_VERSION = 1
#: The operator's extra redaction patterns: one Python regex a line (``#`` comments, blank lines ignored).
PATTERNS_FILE = "bundle-redact.txt"
MANIFEST = "manifest.json"
#: What ``inspect_bundle`` reads of a manifest at most; a bigger one is no bundle this code wrote.
MAX_MANIFEST_BYTES = 64 << 20
EVENT_PAGE = 500
_CHUNK = 1 << 20


class BundleError(Exception):
    """A bundle that cannot be written or read (the message is one line for the user)."""


# -- redaction --------------------------------------------------------------------------------------

#: Built-in patterns, in the order they are applied (a block before the keys inside it).
_BUILTIN: tuple[tuple[str, str], ...] = (
    ("private_key", r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)"),
    ("authorization", r"(?i)\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?(?P<secret>[^\r\n\"']+)"),
    ("bearer", r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}"),
    ("api_token", r"\bcsk_[A-Za-z0-9_-]{20,}"),
    ("key", r"\bsk-[A-Za-z0-9_-]{12,}"),
    ("key", (r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}"
            r"|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{30,})")),
    ("secret_assignment", (r"(?i)\b[A-Z0-9_]*(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD)[\"']?\s*[:=]\s*[\"']?"
                           r"(?P<secret>[^\s\"',;]{8,})")),
)
#: Long runs of base64/hex characters: redacted when they look random (``_looks_random``).
_TOKEN_RUN = re.compile(r"(?<![A-Za-z0-9+/=_-])[A-Za-z0-9+/=_-]{32,}")
_ID = re.compile(r"[a-z]+_[0-9a-f]{32}")
_HEX = re.compile(r"[0-9a-fA-F]+")


def _entropy(text: str) -> float:
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def _looks_random(run: str) -> str | None:
    """The kind of secret a long base64/hex run looks like, or None (ids, hashes, paths, words)."""
    for part in run.split("/"):
        part = part.strip("=")
        if len(part) < 24 or _ID.fullmatch(part):
            continue
        if _HEX.fullmatch(part):
            if len(part) >= 32:
                return "hex_secret"
            continue
        if (any(c.isupper() for c in part) and any(c.islower() for c in part) and any(c.isdigit() for c in part)
                and _entropy(part) >= 4.0):
            return "base64_secret"
    return None


class Redactor:
    """Replaces secrets in strings with ``[REDACTED:<kind>]`` and counts them per file and kind."""

    def __init__(self, literals: Mapping[str, str], extra_patterns: Sequence[str] = ()) -> None:
        """``literals``: secret value -> kind (redacted wherever they occur; those under 8 characters only as a
        whole word); ``extra_patterns``: the operator's regexes (kind ``pattern``)."""
        self.counts: dict[str, Counter[str]] = {}
        self._rules: list[tuple[str, re.Pattern[str]]] = []
        for value, kind in sorted(literals.items(), key=lambda item: -len(item[0])):
            if not value:
                continue
            escaped = re.escape(value)
            self._rules.append((kind, re.compile(escaped if len(value) >= 8 else rf"(?<!\w){escaped}(?!\w)")))
        for kind, pattern in _BUILTIN:
            self._rules.append((kind, re.compile(pattern)))
        for pattern in extra_patterns:
            try:
                self._rules.append(("pattern", re.compile(pattern)))
            except re.error as exc:
                raise BundleError(f"redaction pattern {pattern!r} is not a valid regex: {exc}") from None

    def text(self, value: str, where: str) -> str:
        counts = self.counts.setdefault(where, Counter())
        for kind, rule in self._rules:
            if rule.search(value) is None:
                continue

            def replace(match: re.Match[str], kind: str = kind) -> str:
                counts[kind] += 1
                if "secret" not in match.re.groupindex:
                    return f"[REDACTED:{kind}]"
                whole, start, end = match.start(), match.start("secret"), match.end("secret")
                return match.string[whole:start] + f"[REDACTED:{kind}]" + match.string[end:match.end()]

            value = rule.sub(replace, value)

        def random_run(match: re.Match[str]) -> str:
            run = match.group(0)
            if value[max(0, match.start() - len(HASH_PREFIX)):match.start()] == HASH_PREFIX:
                return run  # a content hash (blob ref, input hash): names bytes, reveals none
            kind = _looks_random(run)
            if kind is None:
                return run
            counts[kind] += 1
            return f"[REDACTED:{kind}]"

        return _TOKEN_RUN.sub(random_run, value)

    def json(self, value: Any, where: str) -> Any:
        """``value`` (parsed JSON) with every string redacted, keys too."""
        if isinstance(value, str):
            return self.text(value, where)
        if isinstance(value, list):
            return [self.json(v, where) for v in value]
        if isinstance(value, dict):
            return {self.text(str(k), where): self.json(v, where) for k, v in value.items()}
        return value

    def report(self) -> dict[str, dict[str, int]]:
        return {where: dict(sorted(c.items())) for where, c in sorted(self.counts.items()) if c}


def read_patterns_file(data_dir: Path) -> list[str]:
    """The operator's patterns in ``<data-dir>/bundle-redact.txt`` (none when the file is absent)."""
    try:
        text = (Path(data_dir) / PATTERNS_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise BundleError(f"{Path(data_dir) / PATTERNS_FILE} cannot be read: {exc}") from None
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


# -- what goes in ---------------------------------------------------------------------------------

@dataclass
class BundleSources:
    """What a bundle is made of, gathered by the caller (an engine, or tests)."""

    store: StoreReader
    session_id: str
    #: Secret value -> kind: the namespace's stored variable values, tokens this process knows.
    secrets: dict[str, str]
    environment: dict[str, Any]
    config: dict[str, Any]
    workers: dict[str, Any]
    health: dict[str, Any]
    patterns: list[str] = field(default_factory=list)


def codesdk_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("codesdk")
    except PackageNotFoundError:
        return "unknown"


def _fingerprint(env: NamespaceEnv, value: Any) -> str:
    """A keyed hash (the data dir's fingerprint key): equal configurations compare equal; no value can be guessed
    back from it offline."""
    return env.fingerprint(json.dumps(value, sort_keys=True, default=str))


def _options_report(env: NamespaceEnv, options: Any, skip: Iterable[str] = ()) -> dict[str, Any]:
    """Each option of a dataclass: whether it differs from its default, and its fingerprint (never its value)."""
    report: dict[str, Any] = {}
    for f in fields(options):
        if f.name in skip:
            continue
        value = getattr(options, f.name)
        if f.default is not MISSING:
            is_set = value != f.default
        elif f.default_factory is not MISSING:
            is_set = value != f.default_factory()
        else:
            is_set = True  # a required option
        report[f.name] = {"set": is_set, "fingerprint": _fingerprint(env, value)}
    return report


async def sources_from_engine(engine: Engine, session_id: str, *, extra_patterns: Sequence[str] = ()) -> BundleSources:
    """Everything a running engine knows about ``session_id`` and its namespace (no worker is started).

    ``UnknownSession`` if there is no such session."""
    from codesdk.protocol import PROTOCOL_VERSION

    store = engine.store
    session = await store.get_session(session_id)
    namespace = session.namespace
    pool = engine.pool
    data_dir = Path(engine.config.data_dir)
    env = pool.namespace_env
    values: dict[str, str] = await trio.to_thread.run_sync(env.values, namespace)
    secrets = {value: "namespace_env" for value in values.values()}
    for name, value in pool.config.env_for(namespace).items():  # given at start-up: as secret as stored ones,
        if not name.startswith("CODESDK_"):  # but for CodeSDK's own switches (paths, "1"), which are not secrets
            secrets.setdefault(value, "configured_env")
    with contextlib.suppress(OSError):
        token = (await trio.to_thread.run_sync((data_dir / ADMIN_TOKEN_FILE).read_text)).strip()
        if token:
            secrets[token] = "api_token"
    patterns = [*await trio.to_thread.run_sync(read_patterns_file, data_dir), *extra_patterns]

    seen = await store.read_types(session_id, ["session.created", "runtime.request.started"], limit=1000)
    recorded = sorted({json.dumps({"name": e.runtime.name, "model": e.runtime.model}, sort_keys=True)
                       for e in seen})
    worker = pool.worker_of(namespace)
    runtimes: list[Any] = []
    if worker is not None and worker.info is not None:
        runtimes = [offer.to_json_obj() for offer in worker.info.runtimes]
    environment = {
        "codesdk_version": codesdk_version(), "protocol_version": PROTOCOL_VERSION,
        "python": sys.version, "implementation": platform.python_implementation(), "platform": platform.platform(),
        "session_runtime": session.runtime, "namespace": namespace,
        "runtimes_recorded": [json.loads(r) for r in recorded],
        "worker": ({"pid": worker.pid, "version": worker.info.worker.version if worker.info else None,
                    "runtimes": runtimes} if worker is not None else None),
        "runtimes_note": None if runtimes else "no worker of this namespace is running in this supervisor: runtime "
                                               "versions and capabilities are those the events record (none started "
                                               "for the bundle)",
    }
    def config_report() -> dict[str, Any]:  # reads the fingerprint key: file I/O, in a thread
        return {
            "engine": _options_report(env, engine.config, skip=("pool", "quotas")),
            "pool": _options_report(env, pool.config, skip=("env", "policy")),
            "worker_policy": _options_report(env, pool.config.policy),
            "quotas": _options_report(env, engine.config.quotas),
            "worker_env": {scope: {"names": sorted(vs), "fingerprint": _fingerprint(env, vs)}
                           for scope, vs in pool.config.env.items() if scope in ("*", namespace)},
            "namespace_env": [e.to_json_obj() for e in env.entries(namespace)],
            "redaction_patterns": {"count": len(patterns), "fingerprint": _fingerprint(env, patterns)},
        }

    config = await trio.to_thread.run_sync(config_report)
    status = [s for s in pool.status() if s["namespace"] == namespace]
    workers = {"namespace": namespace, "status": status[0] if status else None,
               "stderr_tail": worker.stderr.text() if worker is not None else None}
    if worker is None:
        workers["note"] = ("no worker of this namespace is running in this supervisor; a crashed worker's stderr "
                           "tail is in its task.failed event")
    tasks = await store.list_tasks(session_id)
    health = {
        "store": {"closed": store.closed, "write_failure": store.write_failure,
                  "write_transactions": store.writer_stats.transactions},
        "worker_template": pool.template_state(),
        "namespace_worker_state": status[0]["state"] if status else "stopped",
        "session": {"last_seq": session.last_seq, "tasks": len(tasks),
                    "task_states": dict(Counter(t.state.value for t in tasks)),
                    "active_task": engine.active_task(session_id)},
    }
    return BundleSources(store=store, session_id=session_id, secrets=secrets, environment=environment,
                         config=config, workers=workers, health=health, patterns=patterns)


# -- writing ---------------------------------------------------------------------------------------

def _refs(value: Any, key: str = "") -> Iterator[str]:
    """Blob refs named by an event: the values of ``*_ref`` / ``ref`` keys that are content hashes."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _refs(v, str(k))
    elif isinstance(value, list):
        for v in value:
            yield from _refs(v, key)
    elif isinstance(value, str) and (key == "ref" or key.endswith("_ref")) and is_hash(value):
        yield value


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


async def write_bundle(sources: BundleSources, out: Path, *, force: bool = False) -> dict[str, Any]:
    """Write the bundle to ``out`` (atomically: all of it, or nothing and ``out`` untouched); return its manifest.

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
        digest = hashlib.sha256()
        size = 0
        with events_path.open("wb") as handle:
            after = 0
            while True:
                page = await store.read(sources.session_id, after_seq=after, limit=EVENT_PAGE)
                if not page:
                    break
                objs = [event.to_json_obj() for event in page]
                for obj in objs:
                    refs.update(dict.fromkeys(_refs(obj)))
                    counts[str(obj.get("type"))] += 1

                def redact_page(objs: list[dict[str, Any]] = objs) -> bytes:
                    return b"".join(_json_line(redactor.json(obj, "events.jsonl")) for obj in objs)

                chunk = await trio.to_thread.run_sync(redact_page)  # CPU: not on the loop other tenants share
                await trio.to_thread.run_sync(handle.write, chunk)
                digest.update(chunk)
                size += len(chunk)
                after = page[-1].seq
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


# -- reading back ----------------------------------------------------------------------------------

def inspect_bundle(path: Path) -> dict[str, Any]:
    """The manifest of the bundle at ``path``, after checking every file against it.

    ``BundleError`` (one line) for anything that is not an intact bundle: not a gzip'd tar, no manifest, a file
    missing, added, or not matching its hash, a member that is not a plain file."""
    path = Path(path)
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            members = tar.getmembers()
            if not members or members[0].name != MANIFEST:
                raise BundleError(f"{path} is not a CodeSDK support bundle (no {MANIFEST} first)")
            manifest = _read_manifest(tar, members[0], path)
            files = manifest["files"]
            seen: set[str] = set()
            for member in members[1:]:
                if not member.isfile():
                    raise BundleError(f"{path}: member {member.name!r} is not a plain file; not a bundle this "
                                      "version wrote")
                expected = files.get(member.name)
                if not isinstance(expected, dict) or member.name in seen:
                    raise BundleError(f"{path}: {member.name!r} is not listed in the manifest (tampered with?)")
                seen.add(member.name)
                handle = tar.extractfile(member)
                assert handle is not None
                digest = hashlib.sha256()
                while chunk := handle.read(_CHUNK):
                    digest.update(chunk)
                if digest.hexdigest() != expected.get("sha256"):
                    raise BundleError(f"{path}: {member.name} does not match its sha256 in the manifest "
                                      "(tampered with or damaged)")
            missing = sorted(set(files) - seen)
            if missing:
                raise BundleError(f"{path}: {len(missing)} file(s) of the manifest are missing, e.g. {missing[0]}")
    except FileNotFoundError:
        raise BundleError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BundleError(f"{path} is a directory, not a bundle") from None
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise BundleError(f"{path} is not a CodeSDK support bundle (not a readable .tar.gz: {exc})") from None
    except OSError as exc:
        raise BundleError(f"{path} cannot be read: {exc.strerror or exc}") from None
    return manifest


def _read_manifest(tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> dict[str, Any]:
    if not member.isfile() or member.size > MAX_MANIFEST_BYTES:
        raise BundleError(f"{path}: its {MANIFEST} is not one this code wrote")
    handle = tar.extractfile(member)
    assert handle is not None
    try:
        manifest = json.loads(handle.read())
    except ValueError:
        raise BundleError(f"{path}: its {MANIFEST} is not valid JSON") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"{path} is not a CodeSDK support bundle (its manifest names another format)")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise BundleError(f"{path}: bundle format version {manifest.get('format_version')!r}; this CodeSDK reads "
                          f"version {FORMAT_VERSION}")
    if not isinstance(manifest.get("files"), dict):
        raise BundleError(f"{path}: its manifest lists no files")
    return manifest


def summary_lines(manifest: Mapping[str, Any]) -> list[str]:
    """What ``codesdk bundle --inspect`` prints."""
    counts = manifest.get("counts", {})
    redactions = manifest.get("redactions", {}).get("by_file", {})
    total: Counter[str] = Counter()
    for kinds in redactions.values():
        total.update(kinds)
    lines = [
        (f"bundle of session {manifest.get('session_id')}  created {manifest.get('created_at')}  "
        f"codesdk {manifest.get('codesdk_version')}  format {manifest.get('format_version')}"),
        f"files: {len(manifest.get('files', {}))} (all match the manifest's sha256)",
        (f"events: {counts.get('events')}  blobs: {counts.get('blobs_included')} of {counts.get('blobs_named')} "
        "named included"),
        "redacted: " + (", ".join(f"{kind}={n}" for kind, n in sorted(total.items())) or "nothing"),
    ]
    lines += [f"  {where}: " + ", ".join(f"{k}={n}" for k, n in kinds.items())
              for where, kinds in redactions.items()]
    return lines
