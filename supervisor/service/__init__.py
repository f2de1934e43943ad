"""The supervisor as a running thing: ``assembly`` puts a store, the worker pool, the owned tools and the engine
together (for ``codesdk run``'s embedded supervisor and for the service), ``serve`` runs the service itself
(``codesdk-supervisor serve``: the API, systemd's notify protocol and watchdog, draining on SIGTERM). Its command
line is ``cli.admin``.

Imported by path: the assembly is all an embedded supervisor needs, without the HTTP stack the service serves with.
"""
