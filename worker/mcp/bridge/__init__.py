"""CodeSDK's tools as an MCP server that an agent spawns itself (ACP agents: Gemini CLI, OpenCode).

Two halves: the worker serves a task's tools on a private unix socket (``endpoint``: ``serve_tools``), and the
bridge process (``python -I -m codesdk.worker.mcp.bridge`` or ``codesdk-worker mcp-bridge``: ``main``, then
``_relay``) is the stdio MCP server the agent starts from ``BridgeEndpoint.mcp_server()``; it relays each
``tools/call`` to the worker.

Imported by path, hence no names here: the bridge process imports this package too, and must not pay for trio and
the protocol's models before it has even reached its worker.
"""
