"""Reading a bundle back (``codesdk bundle --inspect``): every file checked against the manifest's sha256, and a
summary of what the manifest says.

Apart from the writer: it must refuse anything that is not an intact bundle this code wrote (a damaged download, a
tampered archive) with one clear line, and needs nothing of the store or the engine to do so.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import tarfile
import zlib
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._format import FORMAT, FORMAT_VERSION, MANIFEST, BundleError

#: What ``inspect_bundle`` reads of a manifest at most; a bigger one is no bundle this code wrote.
MAX_MANIFEST_BYTES = 64 << 20
_CHUNK = 1 << 20


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
    truncated = manifest.get("truncated")
    if isinstance(truncated, dict):
        kept = f"events through seq {truncated.get('events_through_seq')}"
        if truncated.get("events_from_seq") is not None:
            kept += (f" and from seq {truncated.get('events_from_seq')}; {truncated.get('events_left_out')} "
                     "between them left out")
        lines.append(f"TRUNCATED at {truncated.get('max_bytes')} bytes ({kept}): {truncated.get('why')}")
    return lines
