"""Canonical JSON (RFC 8785) and the ``sha256:<hex>`` content hashes built on it.

Hashes identify tool inputs, compiled model inputs and blobs; they must not depend on key order,
whitespace or the process that computed them, so every hash goes through RFC 8785 canonical form.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import rfc8785
from pydantic import BaseModel

HASH_PREFIX = "sha256:"

#: RFC 8785 numbers are IEEE doubles: integers beyond this lose precision and are refused.
MAX_SAFE_INTEGER = 2**53 - 1


class CanonicalizationError(ValueError):
    """A value has no canonical JSON form. ``path`` points at the offending value (JSON-pointer style)."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path or "/"
        self.problem = problem
        super().__init__(f"cannot canonicalize value at {self.path}: {problem}")


def _find_problem(value: object, path: str) -> CanonicalizationError | None:
    """Locate the first value JSON can't represent, so the error names where it is."""
    if value is None or isinstance(value, (bool, str)):
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return CanonicalizationError(path, "string holds a lone surrogate (not valid Unicode)")
        return None
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            return CanonicalizationError(
                path, f"integer {value} is outside +/-(2**53-1); send it as a string"
            )
        return None
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return CanonicalizationError(path, f"{value!r} is not a JSON number (NaN/Infinity)")
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return CanonicalizationError(path, f"object key {key!r} is a {type(key).__name__}, not a string")
            found = _find_problem(item, f"{path}/{key}")
            if found:
                return found
        return None
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        for index, item in enumerate(value):
            found = _find_problem(item, f"{path}/{index}")
            if found:
                return found
        return None
    return CanonicalizationError(path, f"{type(value).__name__} is not a JSON type")


def canonical_json(value: Any) -> bytes:
    """RFC 8785 canonical UTF-8 bytes of a JSON value (or a pydantic model, dumped in JSON mode)."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    problem = _find_problem(value, "")
    if problem is not None:
        raise problem
    try:
        return bytes(rfc8785.dumps(value))
    except Exception as exc:  # rfc8785 has its own error types; present one kind to callers
        raise CanonicalizationError("", str(exc)) from exc


def sha256_hex(data: bytes) -> str:
    """``sha256:<hex>`` of raw bytes (blob ids use the same format)."""
    return HASH_PREFIX + hashlib.sha256(data).hexdigest()


def canonical_hash(value: Any) -> str:
    """``sha256:<hex>`` over the canonical JSON of ``value``."""
    return sha256_hex(canonical_json(value))


def is_hash(text: str) -> bool:
    """True for a well-formed ``sha256:<64 lowercase hex>`` string."""
    digest = text[len(HASH_PREFIX):]
    return (
        text.startswith(HASH_PREFIX)
        and len(digest) == 64
        and all(c in "0123456789abcdef" for c in digest)
    )
