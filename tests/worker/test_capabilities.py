"""Every runtime's declared capabilities: the models an app feature-detects by (auth, tool execution, permissions,
state, resume, replay, MCP, cancellation) are each set, and none contradicts another field of the declaration.
Whether each runtime behaves as declared is the adapter contract suite's to check (tests/contract)."""

from __future__ import annotations

import pytest

from codesdk.protocol import (
    AuthModel,
    CancellationModel,
    McpTransport,
    ReplaySafety,
    RuntimeCapabilities,
    StateModel,
    ToolRouting,
    capability_conflicts,
)
from codesdk.worker.adapters.registry import default_registry

RUNTIMES = sorted(default_registry().adapters)


@pytest.fixture(params=RUNTIMES)
def declared(request: pytest.FixtureRequest) -> RuntimeCapabilities:
    adapter = default_registry().get(request.param)
    assert adapter is not None
    return adapter.capabilities()


def test_every_runtime_is_declared(declared: RuntimeCapabilities) -> None:
    assert {"scripted", "claude", "codex"} <= set(RUNTIMES)


def test_no_runtime_contradicts_itself(declared: RuntimeCapabilities) -> None:
    assert capability_conflicts(declared) == [], declared.name


def test_the_models_an_app_reads_are_each_known(declared: RuntimeCapabilities) -> None:
    assert declared.auth_model is not AuthModel.UNKNOWN
    assert declared.state_model is not StateModel.UNKNOWN
    assert declared.tool_replay is not ReplaySafety.UNKNOWN
    assert declared.cancellation_model is not CancellationModel.UNKNOWN
    assert declared.non_interactive and declared.stop
    if ToolRouting.MCP in declared.tool_routing:  # CodeSDK's tools reach it through the stdio mcp-bridge
        assert McpTransport.STDIO in declared.mcp_transports


def test_conflicts_are_found_and_said() -> None:
    bad = RuntimeCapabilities(name="x", version="1", session_resume=False, resume_model="native",
                              tool_routing=(ToolRouting.MCP,), parallel_tool_calls=False, max_outstanding_tool_calls=4)
    found = capability_conflicts(bad)
    assert "resume_model is native but session_resume is false" in found
    assert "more than one outstanding tool call, but parallel_tool_calls is false" in found
    assert any("stdio" in line for line in found)
