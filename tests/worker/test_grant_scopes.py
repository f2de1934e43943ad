"""What each adapter tells its runtime of a scoped grant, and declares it honours natively (``approval_scopes``)."""

from __future__ import annotations

from codesdk.protocol import GrantScope
from codesdk.worker.adapters.claude.adapter import session_rule
from codesdk.worker.adapters.registry import default_registry


def test_every_adapter_declares_its_native_scopes_once_always() -> None:
    registry = default_registry()
    declared = {name: adapter.capabilities().approval_scopes for name, adapter in registry.adapters.items()}
    assert all(GrantScope.ONCE in scopes for scopes in declared.values()), declared
    # Telling Codex acceptForSession or an ACP agent allow_always would let it run those calls unasked: unrecorded,
    # and on after the grant is revoked. Claude Code's PreToolUse hook still sees every call, so it may be told.
    assert declared["codex"] == declared["gemini"] == declared["codex-acp"] == (GrantScope.ONCE,)
    assert declared["claude"] == (GrantScope.ONCE, GrantScope.SESSION)


def test_claude_is_told_a_session_grant_for_its_session_only() -> None:
    rule = session_rule("Bash")
    assert rule == {"type": "addRules", "rules": [{"toolName": "Bash"}], "behavior": "allow", "destination": "session"}
