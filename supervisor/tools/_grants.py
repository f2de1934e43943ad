"""Which calls a grant covers: the matcher of ``codesdk.protocol``'s grant patterns, pure and fail-closed.

A pattern applies to the tools whose input shape it knows (``PATH_FIELDS``, ``COMMAND_FIELDS``, ``URL_FIELDS``);
for any other tool, or an input it cannot read with certainty, it matches nothing:

- ``path``: every path the input names (a known field; ``workspace.list``'s default ``.``) must lie at or under
  the prefix once normalized to workspace-relative form; an absolute path counts only inside the workspace, and a
  path with any ``..`` component (or a backslash, a NUL) matches no prefix. The comparison is lexical, by component: ``src`` covers
  ``src/a.py``, never ``src2/``. (A symlink inside the workspace is the tools' confinement's to follow, as for any
  call: it never leads out of the workspace.)
- ``command``: an argv (a list) must begin with the prefix's words; a command line (a string) is split as the
  shell would and must hold none of the shell's operators or expansions (``; & | < > $ ` ( ) { }``, a newline),
  so ``git status; rm -rf ~`` is not ``git status``.
- ``host``: the host ``http.fetch`` would connect to (its own URL parser), exact or a ``*.`` subdomain; a URL
  that parsers may read differently (a backslash, ``@``, whitespace) matches nothing.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from codesdk.protocol import (
    CommandPattern,
    GrantCreated,
    GrantDecision,
    GrantPattern,
    GrantScope,
    HostPattern,
    PathPattern,
    normalize_relative_path,
)

from ._fetch import FETCH_TOOL_NAME, fetch_host

#: Tools whose input names workspace paths, by (lower-case) tool name: the fields that hold them. Every one of
#: these fields present must be covered; a tool that can reach other paths some other way is not listed.
PATH_FIELDS: Mapping[str, tuple[str, ...]] = {
    "workspace.read": ("path",), "workspace.write": ("path",), "workspace.list": ("path",),
    # Claude Code's file tools, and the generic names of the scripted runtime and ACP agents
    "read": ("file_path",), "write": ("file_path",), "edit": ("file_path",), "multiedit": ("file_path",),
    "notebookread": ("notebook_path",), "notebookedit": ("notebook_path",),
    "read_file": ("path",), "write_file": ("path",),
}
#: Where a path field may be left out, what the tool takes instead.
_PATH_DEFAULTS: Mapping[str, str] = {"workspace.list": "."}
#: Tools that run a command: the field holding its argv (a list) or its command line (a string).
COMMAND_FIELDS: Mapping[str, str] = {
    "workspace.exec": "argv", "bash": "command", "shell": "command", "execute": "command",
    "commandexecution": "command",
}
#: Tools that fetch a URL: the field holding it.
URL_FIELDS: Mapping[str, str] = {FETCH_TOOL_NAME: "url", "webfetch": "url", "fetch": "url"}

#: What a command line may not hold to be read as one plain argv.
_SHELL_SYNTAX = frozenset(";&|<>$`(){}\n\r")


def pattern_kinds(tool_name: str) -> frozenset[str]:
    """The pattern kinds that can match calls of ``tool_name`` (empty: no rule can be written for it)."""
    name = tool_name.lower()
    kinds = {kind for kind, table in (("path", PATH_FIELDS), ("command", COMMAND_FIELDS), ("host", URL_FIELDS))
             if name in table}
    return frozenset(kinds)


def _relative(path: str, workspace: str | None) -> str | None:
    """``path`` normalized to workspace-relative form, or None when it is outside the workspace (or unreadable)."""
    if "\x00" in path:
        return None
    if path.startswith("/"):
        if workspace is None or not workspace.startswith("/"):
            return None
        if "/../" in path + "/":
            return None
        absolute, root = posixpath.normpath("/" + path.lstrip("/")), posixpath.normpath(workspace)
        if absolute == root:
            return "."
        if not absolute.startswith(root.rstrip("/") + "/"):
            return None
        path = absolute[len(root.rstrip("/")) + 1:]
    return normalize_relative_path(path)


def path_under(path: str, prefix: str) -> bool:
    """Whether normalized workspace-relative ``path`` is ``prefix`` or below it (by component)."""
    return prefix == "." or path == prefix or path.startswith(prefix + "/")


def _paths(tool: str, tool_input: Mapping[str, Any]) -> list[Any] | None:
    fields = PATH_FIELDS.get(tool)
    if fields is None:
        return None
    values = [tool_input[f] if f in tool_input else _PATH_DEFAULTS.get(tool) for f in fields]
    present = [v for v in values if v is not None]
    return present or None


def command_words(value: Any) -> list[str] | None:
    """The argv a command field holds: a list of strings as it is, a command line split as the shell would (None
    when it holds shell syntax, or cannot be read)."""
    if isinstance(value, list):
        return value if value and all(isinstance(w, str) for w in value) else None
    if not isinstance(value, str) or any(c in _SHELL_SYNTAX for c in value):
        return None
    try:
        words = shlex.split(value, comments=False, posix=True)
    except ValueError:
        return None
    return words or None


def _plain_url(url: str) -> bool:
    """A URL every parser reads the same host from: no backslash, ``@``, whitespace or control character (a
    runtime's own fetch tool may parse ``https://a.com\\@b.com`` as host a.com where Python reads b.com)."""
    return not any(c in "\\@" or c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url)


def host_matches(host: str, pattern: str) -> bool:
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return host == pattern


def matches(pattern: GrantPattern, tool_name: str, tool_input: Mapping[str, Any],
            workspace: str | None = None) -> bool:
    """Whether a call of ``tool_name`` with ``tool_input`` (in ``workspace``, an absolute path) is covered."""
    tool = tool_name.lower()
    if isinstance(pattern, PathPattern):
        paths = _paths(tool, tool_input)
        if not paths:
            return False
        for value in paths:
            if not isinstance(value, str):
                return False
            relative = _relative(value, workspace)
            if relative is None or not path_under(relative, pattern.prefix):
                return False
        return True
    if isinstance(pattern, CommandPattern):
        field = COMMAND_FIELDS.get(tool)
        words = command_words(tool_input.get(field)) if field is not None else None
        return words is not None and tuple(words[:len(pattern.argv)]) == pattern.argv
    if isinstance(pattern, HostPattern):
        field = URL_FIELDS.get(tool)
        url = tool_input.get(field) if field is not None else None
        host = fetch_host(url) if isinstance(url, str) and _plain_url(url) else None
        return host is not None and host_matches(host, pattern.host)
    return False


def covers(grant: GrantCreated, tool_name: str, tool_input: Mapping[str, Any], *, task_id: str | None,
           workspace: str | None = None) -> bool:
    """Whether ``grant`` decides this call: the same tool, for a ``task`` grant the same task, for a ``rule`` an
    input its pattern matches. (Which session's grants these are is the caller's: only its own.)"""
    if grant.tool_name != tool_name:
        return False
    if grant.scope is GrantScope.TASK and (task_id is None or grant.task_id != task_id):
        return False
    if grant.pattern is not None:
        return matches(grant.pattern, tool_name, tool_input, workspace)
    return grant.scope is not GrantScope.RULE  # a rule without a pattern covers nothing


def deciding_grant(grants: Iterable[GrantCreated], tool_name: str, tool_input: Mapping[str, Any], *,
                   task_id: str | None, workspace: str | None = None) -> GrantCreated | None:
    """The grant that decides this call, if any: a covering ``deny`` over any ``allow``; among equals the
    earliest."""
    covering = [g for g in grants if covers(g, tool_name, tool_input, task_id=task_id, workspace=workspace)]
    denying = [g for g in covering if g.decision is GrantDecision.DENY]
    return next(iter(denying or covering), None)
