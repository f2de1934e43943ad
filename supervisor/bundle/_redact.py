"""The ``Redactor``: every string that goes into a bundle passes it, and secrets become ``[REDACTED:<kind>]``.

Apart from the writer because it is the part a reviewer of "can a secret leak?" reads on its own (and its tests
drive it on its own): literal values known to be secret, built-in patterns for keys and tokens, the operator's own
patterns (``<data-dir>/bundle-redact.txt``), and long random-looking runs. It counts what it redacted per file and
kind, never a value.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from codesdk.protocol import HASH_PREFIX

from ._format import BundleError

#: The operator's extra redaction patterns: one Python regex a line (``#`` comments, blank lines ignored).
PATTERNS_FILE = "bundle-redact.txt"
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
