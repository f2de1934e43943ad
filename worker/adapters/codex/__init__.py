"""The Codex runtime: ``codex app-server`` driven over its JSON-RPC on stdio.

``adapter`` (``CodexAdapter``) drives a task; ``launch`` composes how app-server starts (the standard library only:
the worker may start it ahead of its task, before its own heavy imports); ``home`` reads what Codex keeps in a
namespace's ``CODEX_HOME`` (login state, stored threads). Imported by path, hence no names here.
"""
