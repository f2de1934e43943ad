"""The supervisor's HTTP + SSE API (Starlette on hypercorn's trio worker).

This face is light on purpose: who may call (``TokenAuth``: the tokens file, the admin token) and what callers may
hold (``ApiLimits``) are known without the HTTP stack, so an embedded supervisor (``codesdk run``) and the admin
commands never import Starlette, hypercorn or prometheus. The server itself is ``api.server``, imported by the
service alone.

Usage::

    from codesdk.supervisor.api.server import serve_api

    async with open_engine(SupervisorOptions(data_dir=d)) as engine:
        auth = TokenAuth.bootstrap(d)            # admin token in d/admin.token (0600)
        await serve_api(engine, auth, unix_socket=d / "api.sock")
"""

from ..config import ADMIN_TOKEN_FILE
from ._auth import (TOKENS_FILE, Principal, TokenAuth, TokenEntry, TokenFileInvalid, TokenNameTaken, TokenNotFound,
                    TokensNotMoved, hash_token, open_token_auth)
from ._token_store import (REREAD_S, STALE_AFTER_S, FileTokenStore, MovedTokens, PostgresTokenStore, TokenStore,
                           move_tokens, read_token_file)
from .limits import ApiLimits

__all__ = ["ADMIN_TOKEN_FILE", "REREAD_S", "STALE_AFTER_S", "TOKENS_FILE", "ApiLimits", "FileTokenStore",
           "MovedTokens", "PostgresTokenStore", "Principal", "TokenAuth", "TokenEntry", "TokenFileInvalid", "TokenNameTaken",
           "TokenNotFound", "TokenStore", "TokensNotMoved", "hash_token", "move_tokens", "open_token_auth",
           "read_token_file"]
