"""Scoped grants: an approver's answer that also decides later calls, and the small pattern language of a rule.

A decision on an approval has a ``scope``: ``once`` (this call only), ``task`` (the same tool for the rest of the
task), ``session`` (the same tool for the rest of the session) or ``rule`` (the same tool, for the session, where
its input matches a ``pattern``). Every scope but ``once`` becomes a grant: a ``grant.created`` event in the
session's stream, until a ``grant.revoked``. The policy consults the live grants before it would ask.

A pattern is typed, one kind per input shape, each matched on a normalized form (``supervisor.tools`` holds the
matcher; here only the shapes and their own validity):

- ``path``: a workspace-relative path prefix, compared component by component after normalization; a prefix
  cannot name anything outside the workspace (no absolute path, no ``..`` above its root).
- ``command``: an argv prefix, compared word by word.
- ``host``: a URL's host, exact, or ``*.example.com`` for its subdomains (not the domain itself).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal, TypeAlias

from pydantic import Field, field_validator

from ._base import Model


class GrantScope(StrEnum):
    ONCE = "once"
    TASK = "task"
    SESSION = "session"
    RULE = "rule"


class GrantDecision(StrEnum):
    """What a grant answers: an ``allow``, or a standing ``deny`` (never asked again, denied at once)."""

    ALLOW = "allow"
    DENY = "deny"


#: The longest text a pattern holds (a path, one argv word, a host).
PATTERN_TEXT_MAX = 1024
#: The most words a command prefix holds.
PATTERN_ARGV_MAX = 64


def normalize_relative_path(path: str) -> str | None:
    """``path`` as a normalized workspace-relative path (``"."`` for the root; empty and ``.`` components dropped),
    or None when it is absolute, has any ``..`` component (lexically ``a/link/..`` is ``a``, but not to the file
    system when ``link`` is a symlink: refused rather than guessed), or holds a NUL or a backslash (a separator
    elsewhere, a name character here)."""
    if not path or "\x00" in path or "\\" in path:
        return None
    text = path
    if text.startswith("/"):
        return None
    parts: list[str] = []
    for part in text.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            return None
        else:
            parts.append(part)
    return "/".join(parts) or "."


class PathPattern(Model):
    """Paths at or under ``prefix`` (workspace-relative; ``"."`` is the whole workspace)."""

    kind: Literal["path"] = "path"
    prefix: str = Field(min_length=1, max_length=PATTERN_TEXT_MAX)

    @field_validator("prefix")
    @classmethod
    def _relative(cls, value: str) -> str:
        normal = normalize_relative_path(value)
        if normal is None:
            raise ValueError("must be a path relative to the workspace, such as 'src' or 'docs/api' (no leading "
                             "'/', no '..', no backslash)")
        return normal


class CommandPattern(Model):
    """Commands whose argv begins with ``argv`` (word by word: ``["git", "status"]`` matches ``git status -s``,
    not ``git statusx`` nor ``git status; rm``)."""

    kind: Literal["command"] = "command"
    argv: tuple[Annotated[str, Field(min_length=1, max_length=PATTERN_TEXT_MAX)], ...] = Field(
        min_length=1, max_length=PATTERN_ARGV_MAX)

    @field_validator("argv")
    @classmethod
    def _no_nul(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any("\x00" in word for word in value):
            raise ValueError("an argv word cannot hold a NUL character")
        return value


_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOST = re.compile(rf"(?:\*\.)?{_LABEL}(?:\.{_LABEL})*")


class HostPattern(Model):
    """URLs on ``host`` (a DNS name or IPv4 address, any case; ``*.example.com``: the subdomains of
    example.com)."""

    kind: Literal["host"] = "host"
    host: str = Field(min_length=1, max_length=253)

    @field_validator("host")
    @classmethod
    def _name(cls, value: str) -> str:
        host = value.lower().rstrip(".")
        if not _HOST.fullmatch(host) or host == "*":
            raise ValueError("must be a host name such as 'example.com' or '*.example.com' (no scheme, port or "
                             "path)")
        return host


GrantPattern: TypeAlias = Annotated[PathPattern | CommandPattern | HostPattern, Field(discriminator="kind")]


class GrantCreated(Model):
    """A scoped answer became a grant: it decides the calls of ``tool_name`` in its scope (for ``rule``, those
    whose input matches ``pattern``) until revoked. ``task_id``: the one task a ``task`` grant is for."""

    grant_id: str
    scope: Literal[GrantScope.TASK, GrantScope.SESSION, GrantScope.RULE]  # ``once`` is never a grant
    decision: GrantDecision = GrantDecision.ALLOW
    tool_name: str
    pattern: GrantPattern | None = None
    approval_id: str | None = None
    tool_call_id: str | None = None
    created_by: str = ""
    task_id: str | None = None


class GrantRevoked(Model):
    """A grant decides nothing from here on."""

    grant_id: str
    revoked_by: str = ""
    reason: str = ""


def grant_rule(scope: GrantScope) -> str:
    """The policy rule an evaluation decided by a grant of ``scope`` names (``grant.session`` …)."""
    return f"grant.{scope.value}"

