"""The one error the shared database's namespace settings add (``_pg_state``), importable without psycopg."""


class NamespaceStateUnavailable(RuntimeError):
    """The database could not be read or written; the message names it and says what to do."""
