"""The supervisor's HTTP + SSE API (Starlette on hypercorn's trio worker).

Usage::

    async with open_engine(SupervisorOptions(data_dir=d)) as engine:
        auth = TokenAuth.bootstrap(d)            # admin token in d/admin.token (0600)
        await serve_api(engine, auth, unix_socket=d / "api.sock")
"""

from ..config import ADMIN_TOKEN_FILE
from ._app import ApiError, create_app
from ._auth import TOKENS_FILE, Principal, TokenAuth, TokenFileInvalid, hash_token
from ._serve import serve_api

__all__ = ["ADMIN_TOKEN_FILE", "TOKENS_FILE", "ApiError", "Principal", "TokenAuth", "TokenFileInvalid", "create_app",
           "hash_token", "serve_api"]
