"""CodeSDK's version, defined once: pyproject.toml reads it (``dynamic``), every program reports it (``--version``,
``runtime.initialize``, the clients' names towards runtimes)."""

__version__ = "0.1.0"
