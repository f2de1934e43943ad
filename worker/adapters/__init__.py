"""Runtime adapters the worker hosts: the interface (``base``), the registry of every adapter (``registry``), one
package per runtime (``scripted``, ``claude``, ``codex``, ``acp`` for Agent Client Protocol agents) and the pieces
they share (``_process``: a runtime's program; ``_tool_calls``, ``_rpc_peer``, …).

Imported by path, not through this package: a runtime's ``launch`` module is used before the worker's heavy imports
(``worker._ahead``) and must stay the standard library only, which an eager face here would defeat.
"""
