"""The command lines: ``codesdk`` (``front`` parses and starts ``run``'s worker ahead with ``run_ahead``, then
``local`` or ``remote`` carries the command out; ``common`` is what they share) and ``codesdk-supervisor``
(``admin``: serve, tokens, namespace variables, quarantine).

The top floor of the supervisor: it may use every other package, and it is the only one that uses the API client
(``codesdk.client``, for commands against a running service; tests/test_supervisor_layout.py holds it). Its modules
are imported by path, not through this package: ``front`` must stay light (the standard library only) and import
the rest after ``run``'s worker started; nothing imports ``front`` back.
"""
