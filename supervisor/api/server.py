"""The API's server: the Starlette application (``create_app``) and serving it (``serve_api``).

A module of its own, not part of the package's face, because importing it loads the HTTP stack (Starlette,
hypercorn, prometheus_client): only the service (``codesdk-supervisor serve``) and tests of the API pay for that.
"""

from ._app import ApiError, StreamDrain, create_app
from ._serve import serve_api

__all__ = ["ApiError", "StreamDrain", "create_app", "serve_api"]
