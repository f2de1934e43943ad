"""Permission policy: who may run which tool, decided deterministically and recorded as evaluations.

The codesdk rule is a table of permission mode x tool class (the tool's *risk*, not its name):

============  ==========  =======  =========  =======
mode          read_only   write    dangerous  network
============  ==========  =======  =========  =======
``yolo``      allow       allow    allow      ask (allow where the operator allows unattended fetches)
``auto``      allow       allow    ask        ask
``ask``       allow       ask      ask        ask
============  ==========  =======  =========  =======

``network`` (``http.fetch``) asks even in ``yolo`` by default: a request leaves the supervisor's host, and what it
sends (the URL, headers, a body) can carry the workspace's secrets out, so a human sees each one. Only the
operator can let ``yolo`` tasks fetch unasked (``--allow-fetch-unattended``: ``PolicyRequest.unattended_network``,
rule ``mode.yolo.network.unattended``); the egress policy still applies, and ``auto`` and ``ask`` still ask.

A tool that is not enabled (unknown, or disabled by config) is denied in every mode.

One decision goes like this, each step adding an evaluation (a ``tool.call.policy_evaluated`` event):

1. ``runtime`` (optional, from the caller): what the runtime itself said. A runtime ``deny`` is final (it
   will not run the call anyway); anything else is recorded and the decision continues: a runtime can
   never *widen* what codesdk allows.
2. ``codesdk``: the table above. ``allow``/``deny`` are final.
3. ``ask``: a live grant of the session that covers the call (``supervisor.tools._grants``) answers first, as a
   ``user`` evaluation with rule ``grant.<scope>`` naming the ``grant_id``: the grant is a person's answer given
   ahead, so it is recorded as theirs. A covering ``deny`` grant wins over an ``allow`` one. Grants answer only
   what would be asked: a runtime deny, a tool not enabled, a mode that denies stay denied, and a call the mode
   allows is not looked up. They answer in a non-interactive task too (the person already answered).
4. ``ask`` in an interactive task with no grant: a human answers (the engine's approvals) and that becomes a ``user``
   evaluation; no answer in time, or a failing approver, is a ``codesdk`` denial. In a non-interactive task
   ``ask`` degrades to deny, with a fixed reason, so the same inputs always give the same outcome.

The effective decision (the single ``tool.call.approved``/``denied``) is always allow or deny. This module is
pure: ``evaluate`` stops at an ``ask`` (``ApprovalNeeded``), ``complete`` finishes it with the answer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from codesdk.protocol import (
    GrantCreated,
    GrantDecision,
    GrantPattern,
    GrantScope,
    InteractionMode,
    PermissionMode,
    PolicyDecision,
    PolicySource,
    ToolCallApproved,
    ToolCallDenied,
    ToolCallIdentity,
    ToolCallPolicyEvaluated,
    ToolClass,
    ToolManifest,
    ToolSpec,
    canonical_hash,
    grant_rule,
)

from ._grants import deciding_grant

log = logging.getLogger(__name__)

POLICY_VERSION = "codesdk-policy/1"

ALLOW, DENY, ASK = PolicyDecision.ALLOW, PolicyDecision.DENY, PolicyDecision.ASK

#: The codesdk rule table (see the module docstring).
RULES: Mapping[tuple[PermissionMode, ToolClass], PolicyDecision] = {
    (PermissionMode.YOLO, ToolClass.READ_ONLY): ALLOW,
    (PermissionMode.YOLO, ToolClass.WRITE): ALLOW,
    (PermissionMode.YOLO, ToolClass.DANGEROUS): ALLOW,
    (PermissionMode.YOLO, ToolClass.NETWORK): ASK,
    (PermissionMode.AUTO, ToolClass.READ_ONLY): ALLOW,
    (PermissionMode.AUTO, ToolClass.WRITE): ALLOW,
    (PermissionMode.AUTO, ToolClass.DANGEROUS): ASK,
    (PermissionMode.AUTO, ToolClass.NETWORK): ASK,
    (PermissionMode.ASK, ToolClass.READ_ONLY): ALLOW,
    (PermissionMode.ASK, ToolClass.WRITE): ASK,
    (PermissionMode.ASK, ToolClass.DANGEROUS): ASK,
    (PermissionMode.ASK, ToolClass.NETWORK): ASK,
}

#: ``yolo`` x ``network`` where the operator allows unattended fetches.
RULE_UNATTENDED_NETWORK = "mode.yolo.network.unattended"
RULE_NOT_ENABLED = "tool.not_enabled"
RULE_RUNTIME_DENIED = "runtime.denied"
RULE_NON_INTERACTIVE = "ask.non_interactive"
RULE_NO_APPROVER = "ask.no_approver"
RULE_APPROVER_FAILED = "ask.approver_failed"
RULE_UNANSWERED = "ask.unanswered"
RULE_USER = "user.answer"


def mode_rule(mode: PermissionMode, tool_class: ToolClass) -> str:
    return f"mode.{mode.value}.{tool_class.value}"


@dataclass(frozen=True)
class Evaluation:
    """One policy voice on one call (or the effective decision, then always allow/deny)."""

    source: PolicySource
    decision: PolicyDecision
    reason: str = ""
    rule: str | None = None
    approval_id: str | None = None  # the approval a ``user`` evaluation answered
    grant_id: str | None = None  # the grant that decided (or the grant the answer created)


@dataclass(frozen=True)
class PolicyRequest:
    """Everything the policy looks at for one call. ``tool`` is ``None`` when the tool is not enabled."""

    tool_name: str
    tool: ToolSpec | None
    permission_mode: PermissionMode
    interaction_mode: InteractionMode = InteractionMode.NON_INTERACTIVE
    tools_hash: str | None = None
    input: Mapping[str, Any] = field(default_factory=dict)
    identity: ToolCallIdentity | None = None
    runtime_evaluation: Evaluation | None = None
    #: The operator lets ``yolo`` tasks run network tools unasked (``--allow-fetch-unattended``).
    unattended_network: bool = False
    #: The live grants of the call's session (only its own), the task it is for (a ``task`` grant covers only
    #: that one), and the session's workspace (an absolute path a rule's path prefix is relative to).
    grants: tuple[GrantCreated, ...] = ()
    task_id: str | None = None
    workspace: str | None = None

    @classmethod
    def for_manifest(
        cls,
        manifest: ToolManifest,
        tool_name: str,
        permission_mode: PermissionMode,
        interaction_mode: InteractionMode = InteractionMode.NON_INTERACTIVE,
        **extra: Any,
    ) -> PolicyRequest:
        """A request against the enabled tools of ``manifest`` (its hash goes into the snapshot)."""
        return cls(
            tool_name=tool_name,
            tool=manifest.get(tool_name),
            permission_mode=permission_mode,
            interaction_mode=interaction_mode,
            tools_hash=canonical_hash(manifest),
            **extra,
        )


@dataclass(frozen=True)
class ApprovalRequest:
    """What an approver (a human, via the app) is asked about."""

    tool_name: str
    tool_class: ToolClass
    input: Mapping[str, Any]
    identity: ToolCallIdentity | None
    permission_mode: PermissionMode
    reason: str
    policy_snapshot: Mapping[str, Any]


@dataclass(frozen=True)
class ApproverAnswer:
    """A decision. ``scope`` other than ``once`` also makes a grant (``rule``: with ``pattern``); ``input``: the
    input the call runs with instead of the one asked about (an allow only; validated like any input)."""

    allow: bool
    reason: str = ""
    scope: GrantScope = GrantScope.ONCE
    pattern: GrantPattern | None = None
    input: Mapping[str, Any] | None = None


Approver = Callable[[ApprovalRequest], Awaitable[ApproverAnswer]]


@dataclass(frozen=True)
class PolicyOutcome:
    """The ordered evaluations, the one effective decision, and the snapshot recorded with them."""

    evaluations: tuple[Evaluation, ...]
    effective: Evaluation
    policy_snapshot: dict[str, Any]

    @property
    def approved(self) -> bool:
        return self.effective.decision is ALLOW


@dataclass(frozen=True)
class ApprovalNeeded:
    """``evaluate`` stopped at ``ask`` in an interactive task: someone has to answer ``approval``."""

    evaluations: tuple[Evaluation, ...]
    approval: ApprovalRequest
    policy_snapshot: dict[str, Any]


def _snapshot(request: PolicyRequest, rule: str) -> dict[str, Any]:
    return {
        "policy_version": POLICY_VERSION,
        "permission_mode": request.permission_mode.value,
        "interaction_mode": request.interaction_mode.value,
        "tool_name": request.tool_name,
        "tool_class": request.tool.tool_class.value if request.tool else None,
        "rule": rule,
        "tools_hash": request.tools_hash,
    }


def codesdk_evaluation(request: PolicyRequest) -> Evaluation:
    """The codesdk voice alone: the rule table, or deny for a tool that is not enabled."""
    tool = request.tool
    if tool is None:
        reason = f"tool {request.tool_name!r} is not enabled (unknown, or disabled by configuration)"
        return Evaluation(PolicySource.CODESDK, DENY, reason, RULE_NOT_ENABLED)
    mode, tool_class = request.permission_mode, tool.tool_class
    if (mode, tool_class) == (PermissionMode.YOLO, ToolClass.NETWORK) and request.unattended_network:
        reason = (f"permission mode {mode.value!r} allows {tool_class.value} tools (the operator allows unattended "
                  "fetches)")
        return Evaluation(PolicySource.CODESDK, ALLOW, reason, RULE_UNATTENDED_NETWORK)
    decision = RULES[(mode, tool_class)]
    verb = {ALLOW: "allows", ASK: "needs approval for"}.get(decision, "denies")
    reason = f"permission mode {mode.value!r} {verb} {tool_class.value} tools"
    return Evaluation(PolicySource.CODESDK, decision, reason, mode_rule(mode, tool_class))


def _final(evaluations: list[Evaluation], effective: Evaluation, snapshot: dict[str, Any]) -> PolicyOutcome:
    return PolicyOutcome(tuple(evaluations), effective, snapshot)


def evaluate(request: PolicyRequest) -> PolicyOutcome | ApprovalNeeded:
    """Decide without IO. Returns ``ApprovalNeeded`` only for ``ask`` in an interactive task."""
    evaluations: list[Evaluation] = []
    ours = codesdk_evaluation(request)
    snapshot = _snapshot(request, ours.rule or "")
    runtime = request.runtime_evaluation
    if runtime is not None:
        if runtime.source is not PolicySource.RUNTIME:
            raise ValueError(f"runtime_evaluation must have source 'runtime', not {runtime.source.value!r}")
        evaluations.append(runtime)
        if runtime.decision is DENY:
            reason = (
                f"the runtime denied the call: {runtime.reason}"
                if runtime.reason
                else "the runtime denied the call"
            )
            return _final(
                evaluations, Evaluation(PolicySource.RUNTIME, DENY, reason, RULE_RUNTIME_DENIED), snapshot
            )
    evaluations.append(ours)
    if ours.decision is not ASK:
        return _final(evaluations, ours, snapshot)
    assert request.tool is not None
    grant = deciding_grant(request.grants, request.tool_name, request.input, task_id=request.task_id,
                           workspace=request.workspace)
    if grant is not None:
        decision = ALLOW if grant.decision is GrantDecision.ALLOW else DENY
        verb = "allowed" if decision is ALLOW else "denied"
        reason = f"{verb} by grant {grant.grant_id} ({grant.scope.value} scope)"
        evaluation = Evaluation(PolicySource.USER, decision, reason, grant_rule(grant.scope), grant_id=grant.grant_id)
        evaluations.append(evaluation)
        return _final(evaluations, evaluation, snapshot)
    if request.interaction_mode is InteractionMode.NON_INTERACTIVE:
        reason = (
            f"permission mode {request.permission_mode.value!r} needs approval for "
            f"{request.tool.tool_class.value} tool {request.tool_name!r} but the task is non-interactive"
        )
        return _final(
            evaluations, Evaluation(PolicySource.CODESDK, DENY, reason, RULE_NON_INTERACTIVE), snapshot
        )
    approval = ApprovalRequest(
        tool_name=request.tool_name,
        tool_class=request.tool.tool_class,
        input=request.input,
        identity=request.identity,
        permission_mode=request.permission_mode,
        reason=ours.reason,
        policy_snapshot=snapshot,
    )
    return ApprovalNeeded(tuple(evaluations), approval, snapshot)


def complete(
    pending: ApprovalNeeded, answer: ApproverAnswer | None, *, failure: str | None = None,
    unanswered: str | None = None, approval_id: str | None = None, grant_id: str | None = None,
) -> PolicyOutcome:
    """Finish an ``ask``: a human's ``answer`` (to ``approval_id``), or a denial when there is none — the
    approver failed (``failure``: the reason to record), nobody answered (``unanswered``: why), or there was no
    approver at all."""
    evaluations = list(pending.evaluations)
    if answer is None:
        if failure is not None:
            effective = Evaluation(PolicySource.CODESDK, DENY, failure, RULE_APPROVER_FAILED)
        elif unanswered is not None:
            effective = Evaluation(PolicySource.CODESDK, DENY, f"{pending.approval.reason}, but {unanswered}",
                                   RULE_UNANSWERED)
        else:
            reason = f"{pending.approval.reason}, but no approver is connected"
            effective = Evaluation(PolicySource.CODESDK, DENY, reason, RULE_NO_APPROVER)
        return _final(evaluations, effective, pending.policy_snapshot)
    decision = ALLOW if answer.allow else DENY
    reason = answer.reason or ("approved by the user" if answer.allow else "denied by the user")
    user = Evaluation(PolicySource.USER, decision, reason, RULE_USER, approval_id, grant_id)
    evaluations.append(user)
    return _final(evaluations, user, pending.policy_snapshot)


PolicyPayload = ToolCallPolicyEvaluated | ToolCallApproved | ToolCallDenied


def evaluation_payloads(evaluations: tuple[Evaluation, ...], snapshot: dict[str, Any],
                        identity: ToolCallIdentity) -> list[ToolCallPolicyEvaluated]:
    """One ``tool.call.policy_evaluated`` per evaluation, in order."""
    ids = identity.model_dump()
    return [
        ToolCallPolicyEvaluated(
            **ids,
            source=item.source,
            decision=item.decision,
            reason=item.reason,
            rule=item.rule,
            policy_snapshot=snapshot,
            approval_id=item.approval_id,
            grant_id=item.grant_id,
        )
        for item in evaluations
    ]


def policy_payloads(outcome: PolicyOutcome, identity: ToolCallIdentity) -> list[PolicyPayload]:
    """The events of one decision, in order: each evaluation, then exactly one approved or denied."""
    ids = identity.model_dump()
    snapshot = outcome.policy_snapshot
    payloads: list[PolicyPayload] = [*evaluation_payloads(outcome.evaluations, snapshot, identity)]
    effective = outcome.effective
    if outcome.approved:
        payloads.append(
            ToolCallApproved(
                **ids, source=effective.source, reason=effective.reason, policy_snapshot=snapshot
            )
        )
    else:
        payloads.append(
            ToolCallDenied(**ids, source=effective.source, reason=effective.reason, policy_snapshot=snapshot)
        )
    return payloads
