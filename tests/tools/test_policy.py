"""Permission policy: the mode x class table, interactive/non-interactive, approver use, events, replay."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest
import trio

from codesdk.protocol import (
    EventType,
    InteractionMode,
    PermissionMode,
    PolicyDecision,
    PolicySource,
    ToolCallApproved,
    ToolCallDenied,
    ToolCallIdentity,
    ToolCallPolicyEvaluated,
    ToolClass,
    ToolSpec,
    canonical_hash,
    parse_payload,
)
from codesdk.supervisor.tools import (
    POLICY_VERSION,
    RULES,
    ApprovalNeeded,
    ApprovalRequest,
    ApproverAnswer,
    EgressPolicy,
    Evaluation,
    ExecPolicy,
    FetchPolicy,
    HostPattern,
    PolicyOutcome,
    PolicyRequest,
    ToolRegistry,
    ToolsConfig,
    complete,
    evaluate,
    input_hash,
    is_replay_safe,
    policy_payloads,
)

Y, A, K = PermissionMode.YOLO, PermissionMode.AUTO, PermissionMode.ASK
RO, W, D, N = ToolClass.READ_ONLY, ToolClass.WRITE, ToolClass.DANGEROUS, ToolClass.NETWORK
ALLOW, DENY, ASK = PolicyDecision.ALLOW, PolicyDecision.DENY, PolicyDecision.ASK
INTERACTIVE, BATCH = InteractionMode.INTERACTIVE, InteractionMode.NON_INTERACTIVE

#: The documented table: what codesdk says for each (mode, class).
TABLE = {
    (Y, RO): ALLOW, (Y, W): ALLOW, (Y, D): ALLOW, (Y, N): ASK,
    (A, RO): ALLOW, (A, W): ALLOW, (A, D): ASK, (A, N): ASK,
    (K, RO): ALLOW, (K, W): ASK, (K, D): ASK, (K, N): ASK,
}  # fmt: skip


def test_the_table_covers_every_mode_and_class() -> None:
    """A new mode or class must get its row or column here and in the policy's table alike."""
    assert set(TABLE) == set(itertools.product(PermissionMode, ToolClass)) and dict(RULES) == TABLE


def spec(tool_class: ToolClass, name: str = "t.tool") -> ToolSpec:
    return ToolSpec(name=name, tool_class=tool_class)


class Approver:
    """Records every request and answers as told."""

    def __init__(self, allow: bool, reason: str = "") -> None:
        self.allow = allow
        self.reason = reason
        self.requests: list[ApprovalRequest] = []

    async def __call__(self, request: ApprovalRequest) -> ApproverAnswer:
        self.requests.append(request)
        await trio.lowlevel.checkpoint()
        return ApproverAnswer(allow=self.allow, reason=self.reason)


async def decide_soon(request: PolicyRequest, approver: Any = None) -> PolicyOutcome:
    """evaluate -> (ask the approver) -> complete, as the engine does around its stored approvals."""
    step = evaluate(request)
    if isinstance(step, PolicyOutcome):
        return step
    if approver is None:
        return complete(step, None)
    try:
        with trio.fail_after(5):
            answer = await approver(step.approval)
    except RuntimeError as exc:
        return complete(step, None, failure=f"approval failed: {type(exc).__name__}: {exc}")
    return complete(step, answer)


@pytest.mark.parametrize(
    ("mode", "tool_class", "interaction", "answer"),
    list(itertools.product([Y, A, K], [RO, W, D, N], [INTERACTIVE, BATCH], [True, False])),
)
async def test_policy_matrix(
    mode: PermissionMode, tool_class: ToolClass, interaction: InteractionMode, answer: bool
) -> None:
    approver = Approver(allow=answer)
    request = PolicyRequest(
        "t.tool", spec(tool_class), mode, interaction, tools_hash="sha256:" + "0" * 64, input={"path": "x"}
    )
    outcome = await decide_soon(request, approver)
    expected = TABLE[(mode, tool_class)]
    first = outcome.evaluations[0]
    assert (first.source, first.decision, first.rule) == (
        PolicySource.CODESDK,
        expected,
        f"mode.{mode}.{tool_class}",
    )
    assert outcome.effective.decision in (ALLOW, DENY)
    if expected is ALLOW:
        assert outcome.approved and outcome.effective is first and approver.requests == []
    elif interaction is BATCH:
        assert not outcome.approved and approver.requests == []
        assert outcome.effective.source is PolicySource.CODESDK
        assert outcome.effective.rule == "ask.non_interactive"
        assert f"permission mode '{mode}' needs approval" in outcome.effective.reason
        assert outcome.effective.reason.endswith("but the task is non-interactive")
        assert len(outcome.evaluations) == 1
    else:
        assert len(approver.requests) == 1
        asked = approver.requests[0]
        assert (asked.tool_name, asked.tool_class, asked.permission_mode, dict(asked.input)) == (
            "t.tool",
            tool_class,
            mode,
            {"path": "x"},
        )
        user = outcome.evaluations[1]
        assert (user.source, user.decision) == (PolicySource.USER, ALLOW if answer else DENY)
        assert outcome.effective is user and outcome.approved is answer
    assert outcome.policy_snapshot == {
        "policy_version": POLICY_VERSION,
        "permission_mode": mode.value,
        "interaction_mode": interaction.value,
        "tool_name": "t.tool",
        "tool_class": tool_class.value,
        "rule": f"mode.{mode}.{tool_class}",
        "tools_hash": "sha256:" + "0" * 64,
    }


@pytest.mark.parametrize(("mode", "interaction"), list(itertools.product([Y, A, K], [INTERACTIVE, BATCH])))
async def test_tools_not_enabled_are_denied_in_every_mode(
    mode: PermissionMode, interaction: InteractionMode
) -> None:
    approver = Approver(allow=True)
    outcome = await decide_soon(PolicyRequest("ghost", None, mode, interaction), approver)
    assert not outcome.approved and approver.requests == []
    assert (
        outcome.effective.rule == "tool.not_enabled" and "'ghost' is not enabled" in outcome.effective.reason
    )
    assert outcome.policy_snapshot["tool_class"] is None


#: With the operator's ``--allow-fetch-unattended``: yolo runs network tools unasked, nothing else changes.
UNATTENDED_TABLE = {**TABLE, (Y, N): ALLOW}


@pytest.mark.parametrize(("mode", "tool_class", "interaction"),
                         list(itertools.product([Y, A, K], [RO, W, D, N], [INTERACTIVE, BATCH])))
async def test_unattended_network_lets_only_yolo_fetch_unasked(
    mode: PermissionMode, tool_class: ToolClass, interaction: InteractionMode
) -> None:
    approver = Approver(allow=True)
    request = PolicyRequest("t.tool", spec(tool_class), mode, interaction, unattended_network=True)
    outcome = await decide_soon(request, approver)
    first = outcome.evaluations[0]
    assert first.decision is UNATTENDED_TABLE[(mode, tool_class)]
    if (mode, tool_class) == (Y, N):
        assert outcome.approved and approver.requests == [] and outcome.effective is first
        assert first.rule == outcome.policy_snapshot["rule"] == "mode.yolo.network.unattended"
        assert "the operator allows unattended fetches" in first.reason
    else:
        assert first.rule == f"mode.{mode}.{tool_class}"
        assert outcome == await decide_soon(replace(request, unattended_network=False), approver)


def test_unattended_network_is_the_fetch_operators_switch() -> None:
    egress = EgressPolicy(hosts=(HostPattern.parse("api.example.com"),))
    assert not ToolRegistry().unattended_network
    assert not ToolRegistry(ToolsConfig(fetch=FetchPolicy(egress=egress))).unattended_network
    assert not ToolRegistry(ToolsConfig(fetch=FetchPolicy(unattended=True))).unattended_network  # fetch is off
    assert ToolRegistry(ToolsConfig(fetch=FetchPolicy(egress=egress, unattended=True))).unattended_network


async def test_disabled_exec_is_denied_even_in_yolo() -> None:
    manifest = ToolRegistry().manifest()
    outcome = await decide_soon(
        PolicyRequest.for_manifest(manifest, "workspace.exec", Y, INTERACTIVE), Approver(True)
    )
    assert not outcome.approved
    enabled = ToolRegistry(ToolsConfig(exec=ExecPolicy(enabled=True, allowlist=("echo",)))).manifest()
    outcome = await decide_soon(PolicyRequest.for_manifest(enabled, "workspace.exec", Y, BATCH))
    assert outcome.approved
    assert outcome.policy_snapshot["tools_hash"] == canonical_hash(enabled)


def test_evaluate_is_pure_and_deterministic() -> None:
    request = PolicyRequest("t.tool", spec(W), K, BATCH)
    assert evaluate(request) == evaluate(request)
    pending = evaluate(PolicyRequest("t.tool", spec(W), K, INTERACTIVE))
    assert isinstance(pending, ApprovalNeeded)
    assert pending.approval.reason == "permission mode 'ask' needs approval for write tools"


async def test_interactive_ask_without_approver_denies() -> None:
    outcome = await decide_soon(PolicyRequest("t.tool", spec(D), A, INTERACTIVE))
    assert not outcome.approved and outcome.effective.rule == "ask.no_approver"
    assert "no approver is connected" in outcome.effective.reason


async def test_failing_approver_denies() -> None:
    async def broken(request: ApprovalRequest) -> ApproverAnswer:
        raise RuntimeError("ui went away")

    outcome = await decide_soon(PolicyRequest("t.tool", spec(D), A, INTERACTIVE), broken)
    assert not outcome.approved and outcome.effective.rule == "ask.approver_failed"
    assert "RuntimeError: ui went away" in outcome.effective.reason


async def test_user_reason_is_kept() -> None:
    outcome = await decide_soon(
        PolicyRequest("t.tool", spec(W), K, INTERACTIVE), Approver(False, "not in prod")
    )
    assert outcome.effective.reason == "not in prod"


async def test_runtime_evaluation_is_recorded_first() -> None:
    runtime = Evaluation(PolicySource.RUNTIME, ALLOW, "claude hook allowed", "claude.pre_tool_use")
    outcome = await decide_soon(PolicyRequest("t.tool", spec(W), A, BATCH, runtime_evaluation=runtime))
    assert [e.source for e in outcome.evaluations] == [PolicySource.RUNTIME, PolicySource.CODESDK]
    assert outcome.approved and outcome.effective.source is PolicySource.CODESDK


async def test_runtime_allow_cannot_widen_codesdk() -> None:
    runtime = Evaluation(PolicySource.RUNTIME, ALLOW)
    outcome = await decide_soon(PolicyRequest("t.tool", spec(D), K, BATCH, runtime_evaluation=runtime))
    assert not outcome.approved and outcome.effective.rule == "ask.non_interactive"


async def test_runtime_deny_is_final_and_skips_the_approver() -> None:
    approver = Approver(allow=True)
    runtime = Evaluation(PolicySource.RUNTIME, DENY, "sandbox refused", "codex.approval")
    outcome = await decide_soon(
        PolicyRequest("t.tool", spec(RO), Y, INTERACTIVE, runtime_evaluation=runtime), approver
    )
    assert not outcome.approved and approver.requests == []
    assert outcome.evaluations == (runtime,)
    assert (outcome.effective.source, outcome.effective.reason) == (
        PolicySource.RUNTIME,
        "the runtime denied the call: sandbox refused",
    )


def test_runtime_evaluation_must_come_from_the_runtime() -> None:
    with pytest.raises(ValueError, match="source 'runtime'"):
        evaluate(
            PolicyRequest("t.tool", spec(RO), Y, runtime_evaluation=Evaluation(PolicySource.USER, ALLOW))
        )


IDENTITY = ToolCallIdentity(
    tool_call_id="call-1", runtime_tool_call_id="toolu_1", attempt=2, input_hash=input_hash({"a": 1})
)


async def test_payloads_for_an_approved_call() -> None:
    runtime = Evaluation(PolicySource.RUNTIME, PolicyDecision.ABSTAIN, "no opinion")
    outcome = await decide_soon(
        PolicyRequest("t.tool", spec(W), K, INTERACTIVE, runtime_evaluation=runtime), Approver(True)
    )
    payloads = policy_payloads(outcome, IDENTITY)
    assert [type(p) for p in payloads] == [ToolCallPolicyEvaluated] * 3 + [ToolCallApproved]
    assert [p.source for p in payloads] == [
        PolicySource.RUNTIME,
        PolicySource.CODESDK,
        PolicySource.USER,
        PolicySource.USER,
    ]
    evaluated = payloads[1]
    assert isinstance(evaluated, ToolCallPolicyEvaluated)
    assert (evaluated.decision, evaluated.rule) == (ASK, "mode.ask.write")
    for payload in payloads:
        assert (payload.tool_call_id, payload.runtime_tool_call_id, payload.attempt, payload.input_hash) == (
            "call-1",
            "toolu_1",
            2,
            IDENTITY.input_hash,
        )
        assert payload.policy_snapshot == outcome.policy_snapshot
    event_type = {
        ToolCallPolicyEvaluated: EventType.TOOL_CALL_POLICY_EVALUATED,
        ToolCallApproved: EventType.TOOL_CALL_APPROVED,
    }
    for payload in payloads:
        assert parse_payload(event_type[type(payload)], payload.to_json_obj()) == payload


async def test_payloads_for_a_denied_call() -> None:
    outcome = await decide_soon(PolicyRequest("t.tool", spec(D), A, BATCH))
    payloads = policy_payloads(outcome, IDENTITY)
    assert [type(p) for p in payloads] == [ToolCallPolicyEvaluated, ToolCallDenied]
    denied = payloads[-1]
    assert isinstance(denied, ToolCallDenied)
    assert denied.source is PolicySource.CODESDK and "non-interactive" in denied.reason
    assert parse_payload(EventType.TOOL_CALL_DENIED, denied.to_json_obj()) == denied


def test_replay_safety_by_class() -> None:
    assert is_replay_safe(spec(RO))
    assert not is_replay_safe(spec(W))
    assert not is_replay_safe(spec(D))
    registry = ToolRegistry(ToolsConfig(exec=ExecPolicy(enabled=True, allowlist=("echo",))))
    safe = {tool.name: is_replay_safe(tool) for tool in registry.manifest().tools}
    assert safe == {
        "workspace.read": True,
        "workspace.list": True,
        "workspace.write": False,
        "patch.apply": False,
        "workspace.exec": False,
    }


def test_input_hash_ignores_key_order() -> None:
    assert (
        input_hash({"a": 1, "b": [1, 2]})
        == input_hash({"b": [1, 2], "a": 1})
        == canonical_hash({"a": 1, "b": [1, 2]})
    )
