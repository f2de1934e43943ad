"""The console's routes: its page under ``/console/``, and ``/console/session`` (log in with a token, see who is
logged in, log out). The cookie a login sets authenticates ``/v1`` requests as the token's principal
(``cookie_principal``): the API's own checks decide what it sees, there is no second authorization path."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime

import trio

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from ..audit import audit
from ..console import (
    ASSETS,
    COOKIE,
    CSRF_HEADER,
    SECURITY_HEADERS,
    ConsoleSession,
    ConsoleSessions,
    asset,
    csrf_matches,
)
from ._auth import Principal, TokenAuth, hash_token

#: The largest login body read (a token is 47 characters).
MAX_LOGIN_BODY = 8 << 10
_SAFE_METHODS = frozenset({"GET", "HEAD"})


class ConsoleRefused(Exception):
    """A cookie-authenticated request refused: ``status`` 401 (no live console session) or 403 (CSRF)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def served_over_tls(request: Request) -> bool:
    """The browser reached the service over TLS: directly, or through a reverse proxy that terminates it and says
    so (``X-Forwarded-Proto: https``). Only makes the cookie Secure and the origin https: trusting it loosens
    nothing."""
    return request.url.scheme == "https" or request.headers.get("x-forwarded-proto", "").lower() == "https"


def own_origin(request: Request) -> str:
    """The origin the browser sees this server at: the scheme it used and the Host it sent the request to."""
    host = request.headers.get("host", "")
    return f"{'https' if served_over_tls(request) else request.url.scheme}://{host}"


def cross_site(request: Request) -> str | None:
    """Why the request comes from another site, if it does: an ``Origin`` other than the server's own (``null``
    too), or a ``Sec-Fetch-Site`` that says so. A request that sends neither (not a browser's) passes."""
    origin = request.headers.get("origin")
    if origin is not None and origin != own_origin(request):
        return f"its Origin {origin!r} is not this server's ({own_origin(request)})"
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"its Sec-Fetch-Site is {site!r}"
    return None


def cookie_principal(request: Request, sessions: ConsoleSessions, auth: TokenAuth) -> Principal:
    """The principal of the request's console cookie; ``ConsoleRefused`` when the session has ended (or its token
    was revoked), or when a request that changes something lacks the session's CSRF token or comes from another
    site."""
    session = sessions.find(request.cookies.get(COOKIE))
    principal = None if session is None else auth.authenticate_hash(session.token_sha256)
    if session is None or principal is None:
        if session is not None:
            sessions.close(session.session_id)
        raise ConsoleRefused(401, "unauthorized", "the console session has ended (logged out, expired, or its token "
                                                  "was revoked); log in again at /console/")
    if request.method not in _SAFE_METHODS:
        if not csrf_matches(session, request.headers.get(CSRF_HEADER)):
            raise ConsoleRefused(403, "csrf_failed", "a request made with the console's cookie must carry the "
                                                     "session's X-CSRF-Token header (the console sends it)")
        if (why := cross_site(request)) is not None:
            raise ConsoleRefused(403, "csrf_failed", f"refused a cross-site request: {why}")
    return principal


def _secured(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


def _refusal(status: int, code: str, message: str) -> Response:
    return _secured(JSONResponse({"error": {"code": code, "message": message}}, status_code=status,
                                 headers={"cache-control": "no-store"}))


def _who(session: ConsoleSession, principal: Principal) -> dict[str, object]:
    return {"csrf_token": session.csrf_token,
            "principal": {"name": principal.name, "admin": principal.admin,
                          "namespaces": sorted(principal.namespaces)},
            "expires_at": datetime.fromtimestamp(session.expires_at(), UTC).isoformat().replace("+00:00", "Z")}


def console_routes(sessions: ConsoleSessions, auth: TokenAuth) -> list[Route]:
    async def login(request: Request) -> Response:
        if (why := cross_site(request)) is not None:
            return _refusal(403, "csrf_failed", f"refused a cross-site login: {why}")
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return _refusal(415, "unsupported_media_type", 'send the login as JSON: {"token": "csk_…"}')
        raw = b""
        timeout_s: float = getattr(request.app.state, "body_timeout_s", 30.0)
        with trio.move_on_after(timeout_s) as reading:  # a body trickled in slowly holds a connection: bounded
            async with contextlib.aclosing(request.stream()) as stream:
                async for chunk in stream:
                    raw += chunk
                    if len(raw) > MAX_LOGIN_BODY:
                        return _refusal(413, "body_too_large", f"a login body is at most {MAX_LOGIN_BODY} bytes")
        if reading.cancelled_caught:
            return _refusal(408, "body_timeout", f"the login did not arrive within {timeout_s:g} s")
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        token = body.get("token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token.strip():
            return _refusal(422, "invalid_request", "body field 'token': give the API token to log in with")
        principal = auth.authenticate(token.strip())
        if principal is None:
            return _refusal(401, "unauthorized", "that token is not valid here (`codesdk-supervisor token list` "
                                                 "shows the tokens; the admin's is in <data_dir>/admin.token)")
        if principal.metrics:
            return _refusal(403, "forbidden", "a metrics token reads /metrics and nothing else: it cannot log in")
        sessions.close(request.cookies.get(COOKIE))
        session = sessions.open(hash_token(token.strip()))
        audit("console.login", f"api:{principal.identity}")
        response = JSONResponse(_who(session, principal), status_code=201, headers={"cache-control": "no-store"})
        response.set_cookie(COOKIE, session.session_id, path="/", httponly=True, samesite="strict",
                            secure=served_over_tls(request))
        return _secured(response)

    async def whoami(request: Request) -> Response:
        session = sessions.find(request.cookies.get(COOKIE))
        principal = None if session is None else auth.authenticate_hash(session.token_sha256)
        if session is None or principal is None:
            return _refusal(401, "unauthorized", "not logged in to the console")
        return _secured(JSONResponse(_who(session, principal), headers={"cache-control": "no-store"}))

    async def logout(request: Request) -> Response:
        session = sessions.find(request.cookies.get(COOKIE))
        if session is not None:
            try:
                principal = cookie_principal(request, sessions, auth)
            except ConsoleRefused as refused:
                return _refusal(refused.status, refused.code, refused.message)
            sessions.close(session.session_id)
            audit("console.logout", f"api:{principal.identity}")
        response = Response(status_code=204, headers={"cache-control": "no-store"})
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict",
                               secure=served_over_tls(request))
        return _secured(response)

    async def page(request: Request) -> Response:
        name = request.path_params.get("name") or "index.html"
        if name not in ASSETS:
            return _refusal(404, "not_found", f"the console has no file {name!r}")
        return _secured(Response(asset(name), media_type=ASSETS[name], headers={"cache-control": "no-cache"}))

    async def to_page(request: Request) -> Response:
        return _secured(RedirectResponse("/console/", status_code=308))

    return [Route("/console/session", login, methods=["POST"]),
            Route("/console/session", whoami, methods=["GET"]),
            Route("/console/session", logout, methods=["DELETE"]),
            Route("/console", to_page, methods=["GET"]),
            Route("/console/", page, methods=["GET"]),
            Route("/console/{name}", page, methods=["GET"])]
