"""How a runtime reaches the supervisor's tools: the worker's MCP server (``server``) and the bridge an agent starts
as its MCP server process (``bridge``), which relays to it over a private unix socket."""
