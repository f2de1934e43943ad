"""Scoped grants: the pattern language, its matcher (property-tested: a pattern never reaches past what it names)
and the policy consulting grants before it would ask."""

from __future__ import annotations

import posixpath
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from codesdk.protocol import (
    CommandPattern,
    GrantCreated,
    GrantDecision,
    GrantScope,
    HostPattern,
    InteractionMode,
    PathPattern,
    PermissionMode,
    PolicyDecision,
    PolicySource,
    ToolCallIdentity,
    ToolClass,
    ToolSpec,
    normalize_relative_path,
)
from codesdk.supervisor.tools import (
    ApprovalNeeded,
    PolicyOutcome,
    PolicyRequest,
    deciding_grant,
    evaluate,
    matches,
    pattern_kinds,
    policy_payloads,
)

WS = "/srv/ws/s1"
NAMES = st.sampled_from(["src", "docs", "a", "b", "src2", "s", ".git", "x y", "é"])
SEGMENTS = st.one_of(NAMES, st.sampled_from([".", "..", ""]))
PATHS = st.lists(SEGMENTS, min_size=1, max_size=6).map("/".join)


def _grant(scope: GrantScope = GrantScope.SESSION, tool: str = "workspace.write", pattern: Any = None,
           decision: GrantDecision = GrantDecision.ALLOW, task_id: str | None = None, grant_id: str = "grt_1",
           ) -> GrantCreated:
    return GrantCreated(grant_id=grant_id, scope=scope, tool_name=tool, pattern=pattern, decision=decision,
                        task_id=task_id)


# -- the pattern language --------------------------------------------------------------------------------------

@pytest.mark.parametrize("prefix", ["/etc", "..", "../x", "src/../..", "a/../b", "a\\..\\b", "a\x00b"])
def test_a_path_prefix_cannot_name_anything_outside_the_workspace(prefix: str) -> None:
    with pytest.raises(ValidationError, match="relative to the workspace"):
        PathPattern(prefix=prefix)


def test_a_path_prefix_is_normalized() -> None:
    assert PathPattern(prefix="./src//lib/").prefix == "src/lib"
    assert PathPattern(prefix="./").prefix == "."


@pytest.mark.parametrize("host", ["http://x.com", "x.com:443", "x.com/a", "*", "*.", "a..b", "-a.com", "a b"])
def test_a_host_pattern_is_a_host_only(host: str) -> None:
    with pytest.raises(ValidationError):
        HostPattern(host=host)


def test_host_and_command_patterns() -> None:
    assert HostPattern(host="Docs.Python.org.").host == "docs.python.org"
    with pytest.raises(ValidationError):
        CommandPattern(argv=())
    with pytest.raises(ValidationError):
        CommandPattern(argv=("",))


def test_which_patterns_apply_to_which_tools() -> None:
    assert pattern_kinds("workspace.write") == {"path"}
    assert pattern_kinds("workspace.exec") == {"command"} and pattern_kinds("Bash") == {"command"}
    assert pattern_kinds("http.fetch") == {"host"}
    assert pattern_kinds("patch.apply") == set()  # a patch names its paths inside its text: no rule reads it


# -- the matcher: properties -----------------------------------------------------------------------------------

@given(prefix=PATHS, path=PATHS)
def test_a_path_matches_only_at_or_under_its_prefix(prefix: str, path: str) -> None:
    normal_prefix = normalize_relative_path(prefix)
    if normal_prefix is None:
        return
    covered = matches(PathPattern(prefix=prefix), "workspace.write", {"path": path, "content": ""}, WS)
    normal = normalize_relative_path(path)
    if covered:
        assert normal is not None
        # what the file system would open stays under the prefix, inside the workspace
        opened = posixpath.normpath(posixpath.join(WS, path))
        root = posixpath.normpath(posixpath.join(WS, normal_prefix))
        assert opened == root or opened.startswith(root + "/")
        assert ".." not in path.split("/")
    else:
        assert normal is None or not (normal_prefix == "." or normal == normal_prefix
                                      or normal.startswith(normal_prefix + "/"))


@given(prefix=PATHS, path=PATHS)
def test_an_absolute_path_matches_as_its_workspace_relative_form(prefix: str, path: str) -> None:
    if normalize_relative_path(prefix) is None:
        return
    pattern = PathPattern(prefix=prefix)
    relative = matches(pattern, "Write", {"file_path": path}, WS)
    absolute = matches(pattern, "Write", {"file_path": f"{WS}/{path}"}, WS)
    assert absolute == relative or (normalize_relative_path(path) is None and not relative)


@given(path=PATHS)
def test_nothing_outside_the_workspace_matches_even_the_whole_workspace(path: str) -> None:
    pattern = PathPattern(prefix=".")
    assert not matches(pattern, "workspace.read", {"path": f"/etc/{path}"}, WS)
    assert not matches(pattern, "workspace.read", {"path": f"{WS}/../{path}"}, WS)
    assert not matches(pattern, "workspace.read", {"path": f"{WS}2/{path}"}, WS)
    assert not matches(pattern, "workspace.read", {"path": f"../{path}"}, WS)


def test_path_prefixes_compare_by_component() -> None:
    src = PathPattern(prefix="src")
    assert matches(src, "workspace.write", {"path": "src/a.py", "content": ""}, WS)
    assert matches(src, "workspace.write", {"path": "./src//a.py", "content": ""}, WS)
    assert not matches(src, "workspace.write", {"path": "src2/a.py", "content": ""}, WS)
    assert not matches(src, "workspace.write", {"path": "src/../secrets", "content": ""}, WS)
    assert not matches(src, "workspace.write", {"path": "src\\..\\x", "content": ""}, WS)
    assert matches(PathPattern(prefix="."), "workspace.list", {}, WS)  # its default path is the workspace
    assert not matches(src, "workspace.list", {}, WS)
    assert not matches(src, "patch.apply", {"patch": "--- a/src/x\n"}, WS)
    assert not matches(src, "workspace.write", {"path": ["src/a"]}, WS)


WORDS = st.text(alphabet="abcgitsu-_./ ;&|$`()<>\n'\"", min_size=1, max_size=8)


@given(prefix=st.lists(st.text(alphabet="abgitsu-", min_size=1, max_size=4), min_size=1, max_size=3),
       line=st.lists(WORDS, min_size=1, max_size=5).map(" ".join))
def test_a_command_line_with_shell_syntax_never_matches(prefix: list[str], line: str) -> None:
    covered = matches(CommandPattern(argv=tuple(prefix)), "Bash", {"command": line})
    if covered:
        assert not set(line) & set(";&|$`()<>\n{}")
        assert line.split()[:len(prefix)] == prefix or "'" in line or '"' in line


@given(prefix=st.lists(st.text(min_size=1, max_size=4).filter(lambda w: "\x00" not in w), min_size=1, max_size=3),
       argv=st.lists(st.text(max_size=4), max_size=5))
def test_an_argv_matches_exactly_when_it_begins_with_the_prefix(prefix: list[str], argv: list[str]) -> None:
    covered = matches(CommandPattern(argv=tuple(prefix)), "workspace.exec", {"argv": argv})
    assert covered == (argv[:len(prefix)] == prefix)


def test_commands() -> None:
    git_status = CommandPattern(argv=("git", "status"))
    assert matches(git_status, "Bash", {"command": "git status -s"})
    assert matches(git_status, "Bash", {"command": "git  'status'"})
    assert not matches(git_status, "Bash", {"command": "git statusx"})
    assert not matches(git_status, "Bash", {"command": "git status; rm -rf ~"})
    assert not matches(git_status, "Bash", {"command": "git status $(rm -rf ~)"})
    assert not matches(git_status, "Bash", {"command": "git status\nrm -rf ~"})
    assert not matches(git_status, "Bash", {"command": "FOO=1 git status"})
    assert not matches(git_status, "Bash", {"command": "git 'status"})  # unbalanced quote: unreadable


def test_a_url_parsers_may_read_differently_is_never_covered() -> None:
    pattern = HostPattern(host="evil.com")
    for url in ["https://example.com\\@evil.com/", "https://example.com\\.evil.com", "https://evil.com /x",
                "https://evil.com\t/", "https://a@evil.com/"]:
        assert not matches(pattern, "WebFetch", {"url": url}), url
    assert matches(pattern, "WebFetch", {"url": "https://EVIL.com:443/x?y=1"})


@given(host=st.sampled_from(["example.com", "a.example.com", "example.com.evil.net", "evilexample.com",
                             "b.a.example.com", "EXAMPLE.com"]),
       trick=st.sampled_from(["", "user@", "example.com@"]))
def test_a_host_pattern_matches_the_host_fetch_connects_to(host: str, trick: str) -> None:
    url = f"https://{trick}{host}/path"
    exact = matches(HostPattern(host="example.com"), "http.fetch", {"url": url})
    sub = matches(HostPattern(host="*.example.com"), "http.fetch", {"url": url})
    if trick:
        assert not exact and not sub  # credentials in a URL: fetch refuses it, so no grant covers it
        return
    assert exact == (host.lower() == "example.com")
    assert sub == (host.lower().endswith(".example.com"))


# -- grants and the policy -------------------------------------------------------------------------------------

WRITE = ToolSpec(name="workspace.write", tool_class=ToolClass.WRITE)
IDENTITY = ToolCallIdentity(tool_call_id="c1", attempt=1, input_hash="sha256:" + "0" * 64)


def _request(*grants: GrantCreated, tool: ToolSpec | None = WRITE, task_id: str = "tsk_1",
             mode: PermissionMode = PermissionMode.ASK, path: str = "src/a.py", **extra: Any) -> PolicyRequest:
    return PolicyRequest(tool_name="workspace.write", tool=tool, permission_mode=mode,
                         interaction_mode=InteractionMode.INTERACTIVE, input={"path": path, "content": "x"},
                         identity=IDENTITY, grants=grants, task_id=task_id, workspace=WS, **extra)


def test_a_session_grant_answers_instead_of_asking() -> None:
    outcome = evaluate(_request(_grant()))
    assert isinstance(outcome, PolicyOutcome) and outcome.approved
    assert (outcome.effective.source, outcome.effective.rule, outcome.effective.grant_id) == (
        PolicySource.USER, "grant.session", "grt_1")
    evaluated = [p for p in policy_payloads(outcome, IDENTITY) if hasattr(p, "grant_id")]
    assert evaluated[-1].grant_id == "grt_1"


def test_a_task_grant_covers_only_its_task() -> None:
    grant = _grant(GrantScope.TASK, task_id="tsk_1")
    assert isinstance(evaluate(_request(grant, task_id="tsk_1")), PolicyOutcome)
    assert isinstance(evaluate(_request(grant, task_id="tsk_2")), ApprovalNeeded)


def test_a_rule_covers_only_inputs_its_pattern_matches() -> None:
    rule = _grant(GrantScope.RULE, pattern=PathPattern(prefix="src"))
    assert isinstance(evaluate(_request(rule, path="src/x.py")), PolicyOutcome)
    assert isinstance(evaluate(_request(rule, path="docs/x.md")), ApprovalNeeded)
    assert isinstance(evaluate(_request(rule, path="src/../docs/x.md")), ApprovalNeeded)


def test_a_grant_of_another_tool_decides_nothing() -> None:
    assert isinstance(evaluate(_request(_grant(tool="workspace.read"))), ApprovalNeeded)


def test_a_deny_grant_wins_over_an_allow_grant() -> None:
    allow = _grant(grant_id="grt_a")
    deny = _grant(GrantScope.RULE, pattern=PathPattern(prefix="src"), decision=GrantDecision.DENY, grant_id="grt_d")
    outcome = evaluate(_request(allow, deny))
    assert isinstance(outcome, PolicyOutcome) and not outcome.approved
    assert outcome.effective.grant_id == "grt_d" and outcome.effective.decision is PolicyDecision.DENY
    assert deciding_grant([allow, deny], "workspace.write", {"path": "docs/a"}, task_id=None, workspace=WS) == allow


def test_grants_never_widen_past_a_deny() -> None:
    grant = _grant()
    not_enabled = evaluate(_request(grant, tool=None))
    assert isinstance(not_enabled, PolicyOutcome) and not not_enabled.approved
    assert not_enabled.effective.rule == "tool.not_enabled"
    from codesdk.supervisor.tools import Evaluation
    runtime_deny = evaluate(_request(grant, runtime_evaluation=Evaluation(PolicySource.RUNTIME, PolicyDecision.DENY,
                                                                          "no")))
    assert isinstance(runtime_deny, PolicyOutcome) and runtime_deny.effective.rule == "runtime.denied"


def test_a_call_the_mode_allows_is_not_decided_by_a_grant() -> None:
    outcome = evaluate(_request(_grant(decision=GrantDecision.DENY), mode=PermissionMode.YOLO))
    assert isinstance(outcome, PolicyOutcome) and outcome.approved and outcome.effective.grant_id is None


def test_a_grant_answers_in_a_non_interactive_task_too() -> None:
    request = _request(_grant())
    outcome = evaluate(PolicyRequest(**{**request.__dict__, "interaction_mode": InteractionMode.NON_INTERACTIVE}))
    assert isinstance(outcome, PolicyOutcome) and outcome.approved and outcome.effective.rule == "grant.session"


def test_once_is_never_a_grant() -> None:
    with pytest.raises(ValidationError):
        GrantCreated(grant_id="g", scope=GrantScope.ONCE, tool_name="x")  # type: ignore[arg-type]
