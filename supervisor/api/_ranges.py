"""HTTP byte ranges (RFC 9110 §14) of one representation, sans-IO: which bytes a ``Range`` header asks for.

Written here rather than taken from Starlette: its range support lives in ``FileResponse`` (a file on disk), and a
blob is served from the bytes the store verified against their hash. Only a single range is served; a header
asking for several is answered with the whole representation, which RFC 9110 allows.
"""

from __future__ import annotations

import re
from typing import Final

#: ``bytes=first-last``, ``bytes=first-`` or ``bytes=-suffix``: one range, digits only (whitespace as RFC 9110's OWS).
_ONE_RANGE: Final = re.compile(r"bytes[ \t]*=[ \t]*(?:([0-9]{1,19})[ \t]*-[ \t]*([0-9]{0,19})|-[ \t]*([0-9]{1,19}))[ \t]*")


class Unsatisfiable(Exception):
    """The range starts past the end (or asks for a zero-length suffix): 416 with ``Content-Range: bytes */size``."""


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The half-open ``(start, stop)`` slice a ``Range`` header asks for, or None: send the whole (no header, another
    unit, several ranges, or a malformed one, which RFC 9110 says to ignore). ``Unsatisfiable`` when no byte of it
    exists."""
    if header is None:
        return None
    match = _ONE_RANGE.fullmatch(header)
    if match is None:
        return None
    first, last, suffix = match.groups()
    if suffix is not None:
        length = int(suffix)
        if length == 0 or size == 0:
            raise Unsatisfiable(header)
        return max(0, size - length), size
    start = int(first)
    if last:
        if int(last) < start:
            return None  # an invalid range: ignored, like any malformed one
        stop = min(int(last) + 1, size)
    else:
        stop = size
    if start >= size:
        raise Unsatisfiable(header)
    return start, stop
