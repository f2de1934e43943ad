"""The MCP transport matrix of support bundles: for every runtime CodeSDK hosts, CodeSDK's tools come by the stdio
mcp-bridge exactly when the runtime routes tools by MCP, and a reason is always given."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from codesdk.protocol import McpTransport, RuntimeCapabilities, ToolRouting, mcp_route
from codesdk.worker.adapters.registry import default_registry


@pytest.mark.parametrize("runtime", sorted(default_registry().adapters))
def test_every_runtime_has_a_route_its_declaration_explains(runtime: str) -> None:
    adapter = default_registry().get(runtime)
    assert adapter is not None
    caps = adapter.capabilities()
    route = mcp_route(runtime, caps)
    assert route.supports == caps.mcp_transports and route.why
    assert (route.chosen == McpTransport.STDIO) == (ToolRouting.MCP in caps.tool_routing)


@given(routing=st.sets(st.sampled_from(ToolRouting)), transports=st.sets(st.sampled_from(McpTransport)))
def test_the_chosen_transport_is_one_the_runtime_supports(routing: set[ToolRouting],
                                                          transports: set[McpTransport]) -> None:
    caps = RuntimeCapabilities(name="x", version="1", tool_routing=tuple(sorted(routing)),
                               mcp_transports=tuple(sorted(transports)))
    route = mcp_route("x", caps)
    assert route.chosen is None or route.chosen in transports
    assert route.chosen is not None or ToolRouting.MCP not in routing or McpTransport.STDIO not in transports
