"""Supervisor-owned tools and their permission policy.

Tools (``ToolRegistry``): ``workspace.read``, ``workspace.write``, ``patch.apply``, ``workspace.list`` are on
by default; ``workspace.exec`` is off unless ``ToolsConfig.exec`` enables it, and then runs only allowlisted
commands in a sandbox; ``http.fetch`` is off unless ``ToolsConfig.fetch`` allows some hosts (``_egress``). Every path is confined to the session workspace. ``ToolRegistry.execute`` turns
every caller-caused failure into an error ``ToolResult``.

Policy (``evaluate``/``complete``): permission mode x tool class, recorded as ordered evaluations plus one
effective decision; see ``supervisor.tools._policy`` for the table. ``is_replay_safe`` says which completed
calls may be answered from the store.
"""

from ._base import (
    PREVIEW_MAX_CHARS,
    ErrorCode,
    Tool,
    ToolContext,
    ToolError,
    ToolInput,
    ToolLimits,
    ToolResult,
)
from ._builtins import runtime_tool_spec
from ._diff import DiffError, FilePatch, Hunk, HunkMismatch, apply_hunks, parse_unified_diff, split_lines
from ._exec import DEFAULT_EXEC_PATH, DEFAULT_EXEC_UID, ExecInput, ExecPolicy, check_exec_identity
from ..egress import EgressPolicy, HostPattern, PatternError, address_refusal, parse_network
from ._fetch import (FETCH_TOOL_NAME, Connector, FetchInput, FetchPolicy, FetchTool, Resolver, fetch_host, open_tcp,
                     parse_target,
                     system_resolver)
from ._files import ListInput, ReadInput, WriteInput
from ._patch import PatchInput
from ._paths import ConfinedPath, confine
from ._policy import (
    POLICY_VERSION,
    RULES,
    ApprovalNeeded,
    ApprovalRequest,
    Approver,
    ApproverAnswer,
    Evaluation,
    PolicyOutcome,
    PolicyPayload,
    PolicyRequest,
    codesdk_evaluation,
    complete,
    evaluate,
    evaluation_payloads,
    policy_payloads,
)
from ._grants import COMMAND_FIELDS, PATH_FIELDS, URL_FIELDS, covers, deciding_grant, matches, pattern_kinds
from ._registry import EXEC_TOOL_NAME, ToolRegistry, ToolsConfig
from ._replay import input_hash, is_replay_safe
from ._sandbox import SandboxProber, SandboxTools, probe_sandbox

__all__ = [
    "COMMAND_FIELDS",
    "PATH_FIELDS",
    "URL_FIELDS",
    "covers",
    "deciding_grant",
    "matches",
    "pattern_kinds",
    "DEFAULT_EXEC_PATH",
    "DEFAULT_EXEC_UID",
    "EXEC_TOOL_NAME",
    "FETCH_TOOL_NAME",
    "FetchTool",
    "fetch_host",
    "parse_target",
    "POLICY_VERSION",
    "PREVIEW_MAX_CHARS",
    "RULES",
    "ApprovalNeeded",
    "ApprovalRequest",
    "Approver",
    "ApproverAnswer",
    "ConfinedPath",
    "Connector",
    "DiffError",
    "ErrorCode",
    "EgressPolicy",
    "Evaluation",
    "ExecInput",
    "ExecPolicy",
    "FetchInput",
    "FetchPolicy",
    "FilePatch",
    "HostPattern",
    "Hunk",
    "HunkMismatch",
    "ListInput",
    "PatchInput",
    "PatternError",
    "PolicyOutcome",
    "PolicyPayload",
    "PolicyRequest",
    "ReadInput",
    "Resolver",
    "SandboxProber",
    "SandboxTools",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolInput",
    "ToolLimits",
    "ToolRegistry",
    "ToolResult",
    "ToolsConfig",
    "WriteInput",
    "address_refusal",
    "apply_hunks",
    "check_exec_identity",
    "codesdk_evaluation",
    "complete",
    "confine",
    "evaluate",
    "evaluation_payloads",
    "input_hash",
    "is_replay_safe",
    "open_tcp",
    "parse_network",
    "parse_unified_diff",
    "policy_payloads",
    "probe_sandbox",
    "runtime_tool_spec",
    "split_lines",
    "system_resolver",
]
