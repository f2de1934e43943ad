"""The Claude Code runtime: the pinned CLI (bundled in the ``claude-agent-sdk`` wheel) driven directly over its
stream-json control protocol; the SDK itself is never imported.

``adapter`` (``ClaudeAdapter``) drives a task; ``launch`` composes how the CLI starts (the standard library only: the
worker may start it ahead of its task, before its own heavy imports); ``home`` reads what Claude Code keeps in a
namespace's HOME (login state, stored sessions). Imported by path, hence no names here.
"""
