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

One job per module: ``_format`` (the format and ``BundleError``), ``_redact`` (the ``Redactor``), ``_collect``
(what goes in, from an engine), ``_archive`` (writing the archive atomically), ``_inspect`` (reading one back).
"""

from ._archive import atomic_output, check_output, write_bundle
from ._build import CACHE_DIR, MIN_MAX_BYTES, BundleCache, BundleLimits, BundleRefused, BundleService, build_in_child
from ._collect import BundleSources, codesdk_version, sources_from_engine
from ._format import FORMAT, FORMAT_VERSION, MANIFEST, BundleError
from ._inspect import inspect_bundle, summary_lines
from ._redact import PATTERNS_FILE, Redactor, read_patterns_file

__all__ = ["CACHE_DIR", "MIN_MAX_BYTES", "FORMAT", "BundleCache", "BundleLimits", "BundleRefused", "BundleService", "build_in_child", "FORMAT_VERSION", "MANIFEST", "PATTERNS_FILE", "BundleError", "BundleSources", "Redactor",
           "atomic_output", "check_output", "codesdk_version", "inspect_bundle", "read_patterns_file",
           "sources_from_engine", "summary_lines", "write_bundle"]
