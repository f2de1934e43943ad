"""The CodeSDK worker: hosts runtime adapters and speaks line-delimited JSON-RPC 2.0 on stdio.

Imported first by every worker process (and by the bridge process an agent starts): nothing here but a docstring.
``client`` is the other end: how the supervisor, or a test, starts a worker and speaks to it.
"""
