"""The command lines: ``codesdk`` (``front`` parses and starts ``run``'s worker ahead, then ``local`` or ``remote``
carries the command out) and ``codesdk-supervisor`` (``admin``: serve, tokens, namespace variables, quarantine).

The top floor of the supervisor: it may use every other package, and it is the only one that uses the API client
(``codesdk.client``, for commands against a running service). Its modules are imported by path, not through this
package: ``front`` must stay light (the standard library only) and import the rest after ``run``'s worker started.
"""
