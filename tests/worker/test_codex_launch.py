"""How Codex is launched, without starting it: what reaches its command line and environment, and what does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from codesdk.supervisor.workers import launch as worker_launch
from codesdk.worker.adapters.codex.launch import BadCodexConfig, CodexSettings, codex_home, codex_launch
from codesdk.worker.adapters.codex.adapter import approval_answer
from codesdk.worker.command import RUNTIMES_DIR_ENV


def test_the_supervisors_runtimes_dir_reaches_every_namespace_unless_given() -> None:
    given = worker_launch.workers_env({"user:a": {"X": "1"}}, test_scenarios=False,
                                      environ={RUNTIMES_DIR_ENV: "/opt/runtimes"})
    assert given["*"] == {RUNTIMES_DIR_ENV: "/opt/runtimes"} and given["user:a"] == {"X": "1"}
    own = worker_launch.workers_env({"*": {RUNTIMES_DIR_ENV: "/elsewhere"}}, test_scenarios=False,
                                    environ={RUNTIMES_DIR_ENV: "/opt/runtimes"})
    assert own["*"] == {RUNTIMES_DIR_ENV: "/elsewhere"}
    assert worker_launch.workers_env({}, test_scenarios=False, environ={}) == {}


def test_codex_home_is_always_the_namespace_homes_own() -> None:
    """A CODEX_HOME among a namespace's variables would let it name another namespace's logins and threads."""
    env = {"HOME": "/data/namespaces/user.eve/home", "CODEX_HOME": "/data/namespaces/user.alice/home/.codex"}
    assert codex_home(env) == Path("/data/namespaces/user.eve/home/.codex")
    launch = codex_launch(Path("/bin/codex"), CodexSettings(), cwd="/ws", environ=env)
    assert launch.env["CODEX_HOME"] == "/data/namespaces/user.eve/home/.codex"


def test_the_api_key_stays_in_the_environment_never_on_the_command_line() -> None:
    env = {"HOME": "/h", "OPENAI_API_KEY": "sk-secret-4242", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    launch = codex_launch(Path("/bin/codex"), CodexSettings(max_retries=0), cwd="/ws", environ=env)
    argv = " ".join(launch.argv)
    assert "sk-secret-4242" not in argv and 'env_key="OPENAI_API_KEY"' in argv
    assert 'base_url="http://127.0.0.1:9/v1"' in argv and "request_max_retries=0" in argv
    assert "skills.include_instructions=false" in argv and "project_doc_max_bytes=0" in argv


@pytest.mark.parametrize(("config", "says"), [
    ({"builtin_tools": ["shell"]}, "built-in tools"),
    ({"nonsense": 1}, "nonsense"),
    ({"model": ""}, "model"),
    ({"max_retries": 11}, "max_retries"),
    ({"max_retries": True}, "max_retries"),
    ({"stop_grace_s": -1}, "stop_grace_s"),
])
def test_a_runtime_config_codex_cannot_take_is_refused_saying_why(config: dict[str, object], says: str) -> None:
    with pytest.raises(BadCodexConfig, match=says):
        CodexSettings.from_config(config)


@pytest.mark.parametrize(("method", "allowed", "decision"), [
    ("item/commandExecution/requestApproval", True, "accept"),
    ("item/commandExecution/requestApproval", False, "decline"),
    ("item/fileChange/requestApproval", True, "accept"), ("item/fileChange/requestApproval", False, "decline"),
    ("execCommandApproval", True, "approved"), ("execCommandApproval", False, "denied"),
    ("applyPatchApproval", True, "approved"), ("applyPatchApproval", False, "denied")])
def test_each_approval_is_answered_in_its_protocols_words(method: str, allowed: bool, decision: str) -> None:
    """v2's item/*/requestApproval takes accept/decline; the first protocol's execCommandApproval and
    applyPatchApproval take a ReviewDecision (approved/denied): the other's word would not parse."""
    assert approval_answer(method, allowed) == {"decision": decision}
