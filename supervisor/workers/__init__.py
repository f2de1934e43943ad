"""The supervisor's workers: one per namespace (``pool``), launched as ``launch`` composes it — forked by the worker
template (``template``) or started ahead by the ``codesdk`` command (``launch.Headstart``) — and spoken to through
``codesdk.worker.client``.

Imported by path: ``launch`` stays the standard library only, for the ``codesdk`` command's front.
"""
