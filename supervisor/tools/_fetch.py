"""``http.fetch``: one HTTP(S) GET or HEAD (POST only where the operator allows it) from the supervisor's host, to
hosts the operator allowlisted. Off unless enabled (``--allow-fetch HOST_PATTERN``).

Why the HTTP client is written here, on h11 over ``trio.open_tcp_stream``/``trio.SSLStream``, rather than using
httpx2: the egress policy (``_egress``) must judge the address that is actually connected to. The host is resolved
once (``Resolver``; trio's ``getaddrinfo`` by default), every address it resolves to is checked, and the connection
goes to a checked address itself, so a DNS answer that changes between the check and the connection (rebinding)
cannot move it; TLS still verifies the certificate against the host name. A general client resolves on its own
when it connects and gives no such hold. Every redirect is a new request, checked the same way from the start.
Only the opening of the TCP connection to a checked address is a seam (``FetchPolicy.connect``), for tests.

Limits: a total time (``ToolLimits.fetch_timeout_s``), a body size (the rest is not read: ``truncated``), a
handful of redirects. The body is stored as a blob (``body_ref``); a text preview is returned only for text, JSON
and XML. Failures are typed: ``egress_refused`` (the call asked for something the policy forbids), ``network_error``
(the remote or the way to it failed), ``timeout``.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal
from urllib.parse import urljoin, urlsplit

import trio
from pydantic import Field, JsonValue, field_validator

from codesdk.protocol import SandboxSummary, ToolClass

from ..audit import audit
from ._base import ErrorCode, Tool, ToolContext, ToolError, ToolInput, ToolResult, clip
from ..egress import DEFAULT_PORTS, EgressPolicy, HostPattern, IPAddress, PatternError, normalize_host

if TYPE_CHECKING:
    import h11

log = logging.getLogger(__name__)

FETCH_TOOL_NAME = "http.fetch"
MAX_REDIRECTS = 5
#: Characters of a text body returned inline to the model (the whole body is in the blob).
TEXT_PREVIEW_CHARS = 16 * 1024
_READ_CHUNK = 64 * 1024
_REDIRECTS = {301, 302, 303, 307, 308}
#: Headers a call may not set: hop-by-hop ones, and those the client sets itself.
FORBIDDEN_HEADERS = frozenset({
    "host", "connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te",
    "trailer", "transfer-encoding", "upgrade", "content-length", "expect", "accept-encoding",
})
#: Response headers returned to the model (the rest may carry cookies and such).
SAFE_RESPONSE_HEADERS = frozenset({
    "content-type", "content-length", "content-language", "content-disposition", "last-modified", "etag",
    "cache-control", "expires", "date", "location", "retry-after", "server", "age", "vary",
})
_USER_AGENT = "codesdk-http.fetch/1"

#: Resolves ``host`` for ``port`` to its addresses, once per request (tests inject their own).
Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """The system resolver, through trio (numeric spellings such as ``2130706433`` come back as the address)."""
    infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


#: Opens the TCP connection to an address already checked (tests inject one that opens it in their own network
#: namespace); TLS, if any, goes over it after.
Connector = Callable[[IPAddress, int], Awaitable[trio.SocketStream]]


async def open_tcp(address: IPAddress, port: int) -> trio.SocketStream:
    """A plain TCP connection to ``address`` itself (a literal: nothing is resolved again)."""
    return await trio.open_tcp_stream(str(address), port)


@dataclass(frozen=True)
class FetchPolicy:
    """Operator configuration of ``http.fetch``: on when ``egress`` allows at least one host."""

    egress: EgressPolicy = field(default_factory=EgressPolicy)
    resolver: Resolver = system_resolver
    connect: Connector = open_tcp
    #: Trust store for https (None: the system's).
    ssl_context: ssl.SSLContext | None = None
    #: A namespace's own narrowing of the hosts (``NamespaceEgress.get``): None from it, or no lookup, leaves the
    #: operator's list as is; a tuple allows only hosts both it and the operator's allow.
    namespace_hosts: Callable[[str], tuple[HostPattern, ...] | None] | None = None
    #: ``yolo`` tasks fetch without asking (``--allow-fetch-unattended``; the permission policy reads it).
    unattended: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.egress.hosts)


class FetchInput(ToolInput):
    url: str = Field(min_length=1, max_length=8192, description="http:// or https:// URL on an allowlisted host.")
    method: Literal["GET", "HEAD", "POST"] = Field(
        default="GET", description="GET or HEAD; POST only where the operator allows it.")
    headers: dict[str, str] = Field(default_factory=dict, description="Extra request headers (no hop-by-hop, no Host).")
    body: str | None = Field(default=None, max_length=1024 * 1024, description="POST body (UTF-8).")
    max_bytes: int | None = Field(default=None, gt=0, description="Read at most this many body bytes (capped).")

    @field_validator("headers")
    @classmethod
    def _allowed_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if name.lower() in FORBIDDEN_HEADERS or name.lower().startswith("proxy-"):
                raise ValueError(f"header {name!r} may not be set (hop-by-hop, or set by the tool itself)")
            if not name or any(c in name for c in " :\r\n\t\x00") or any(c in value for c in "\r\n\x00"):
                raise ValueError(f"header {name!r}: names and values may not contain line breaks or NUL")
        return headers


@dataclass(frozen=True)
class Target:
    url: str
    scheme: str
    host: str  # normalized: what patterns compare and TLS verifies
    port: int
    target: str  # path and query, what goes on the request line


@dataclass(frozen=True)
class _Scope:
    """The namespace a call is made for, and its own narrowing of the hosts (None: none)."""

    namespace: str | None
    hosts: tuple[HostPattern, ...] | None
    #: Who makes the call, as messages name it.
    who: str = "http.fetch"


@dataclass
class _Response:
    status: int
    headers: list[tuple[str, str]]
    body: bytearray
    total: int
    truncated: bool

    def header(self, name: str) -> str | None:
        return next((value for key, value in self.headers if key == name), None)


def _refused(message: str) -> ToolError:
    return ToolError(ErrorCode.EGRESS_REFUSED, message)


def fetch_host(url: str) -> str | None:
    """The normalized host ``http.fetch`` would connect to for ``url`` (what grants compare), or None when it
    would refuse the URL."""
    try:
        return parse_target(url).host
    except ToolError:
        return None


#: What HTTP/1.1 lets stand in a request's path and query (RFC 9112 request-target: visible ASCII, no space).
_REQUEST_TARGET = re.compile(r"[\x21-\x7e]+")


def parse_target(url: str, who: str = "http.fetch", credentials_hint: str = "; send them in a header") -> Target:
    """``url`` as a request is made to it, or ``ToolError`` saying why none can be (``who`` names the caller in the
    message: the one parse for ``http.fetch`` and the webhook sender, and for a webhook's registration)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ToolError(ErrorCode.INVALID_INPUT, f"{who}: {url!r} is not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise _refused(f"{who}: {url!r}: only http:// and https:// URLs are allowed")
    if parts.username is not None or parts.password is not None:
        raise _refused(f"{who}: {url!r}: credentials in the URL are not allowed{credentials_hint}")
    if not parts.hostname:
        raise ToolError(ErrorCode.INVALID_INPUT, f"{who}: {url!r} names no host")
    try:
        host = normalize_host(f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname)
    except PatternError as exc:
        raise _refused(f"{who}: {url!r}: {exc}") from None
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    # urlsplit drops tabs and line breaks before it splits: look at the URL as given too
    if not _REQUEST_TARGET.fullmatch(target) or any(c in url for c in "\t\r\n"):
        raise ToolError(ErrorCode.INVALID_INPUT, f"{who}: {url!r}: the path and query may hold only visible ASCII "
                        "(no spaces, line breaks or control characters): percent-encode the rest, e.g. %20")
    return Target(url, scheme, host, port if port is not None else DEFAULT_PORTS[scheme], target)


def _is_text(content_type: str) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return (kind.startswith("text/") or kind in {"application/json", "application/xml", "application/javascript"}
            or kind.endswith(("+json", "+xml")))


def _charset(content_type: str) -> str:
    for part in content_type.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.lower() == "charset" and value:
            return value.strip('"')
    return "utf-8"


class FetchTool:
    """Runs fetches under one ``FetchPolicy``."""

    def __init__(self, policy: FetchPolicy) -> None:
        self.policy = policy

    async def _addresses(self, target: Target, scope: _Scope) -> list[IPAddress]:
        """The checked addresses of ``target``'s host: every one must be allowed (one bad answer spoils all)."""
        egress = self.policy.egress
        if not egress.host_allowed(target.host, target.port, target.scheme):
            raise _refused(f"{target.url!r}: host {target.host}:{target.port} is not allowed for {scope.who} "
                           f"(allowed: {egress.describe_hosts()})")
        if scope.hosts is not None and not any(p.matches(target.host, target.port, target.scheme)
                                               for p in scope.hosts):
            mine = ", ".join(str(p) for p in scope.hosts) or "none"
            raise _refused(f"{target.url!r}: host {target.host}:{target.port} is not allowed for http.fetch in "
                           f"namespace {scope.namespace!r} (its egress policy allows: {mine})")
        try:
            addresses = await self.policy.resolver(target.host, target.port)
        except OSError as exc:
            raise ToolError(ErrorCode.NETWORK_ERROR, f"{target.url!r}: could not resolve {target.host}: {exc}") from None
        if not addresses:
            raise ToolError(ErrorCode.NETWORK_ERROR, f"{target.url!r}: {target.host} has no address")
        for address in addresses:
            refusal = egress.address_refusal(address)
            if refusal is not None:
                raise _refused(f"{target.url!r}: {target.host} resolves to {refusal}; {scope.who} may not reach it")
        return addresses

    async def _connect(self, target: Target, addresses: list[IPAddress]) -> trio.abc.Stream:
        errors = []
        for address in addresses:
            try:
                tcp = await self.policy.connect(address, target.port)
            except OSError as exc:
                errors.append(f"{address}: {exc.strerror or exc}")
                continue
            if target.scheme != "https":
                return tcp
            context = self.policy.ssl_context or ssl.create_default_context()
            tls = trio.SSLStream(tcp, context, server_hostname=target.host, https_compatible=True)
            try:
                await tls.do_handshake()
            except (trio.BrokenResourceError, ssl.SSLError) as exc:
                await trio.aclose_forcefully(tcp)
                raise ToolError(ErrorCode.NETWORK_ERROR, f"{target.url!r}: TLS with {target.host} failed: "
                                f"{exc.__cause__ or exc}") from None
            return tls
        raise ToolError(ErrorCode.NETWORK_ERROR, f"{target.url!r}: could not connect: {'; '.join(errors)}")

    async def _exchange(self, stream: trio.abc.Stream, target: Target, method: str, headers: Mapping[str, str],
                        body: bytes | None, limit: int, user_agent: str = _USER_AGENT,
                        on_status: Callable[[int], None] = lambda status: None) -> _Response:
        import h11  # the service has it (hypercorn); ``codesdk run`` pays for it only when it fetches

        conn = h11.Connection(h11.CLIENT)
        default_host = target.port == DEFAULT_PORTS[target.scheme]
        host = f"[{target.host}]" if ":" in target.host else target.host
        request_headers = [("Host", host if default_host else f"{host}:{target.port}"), ("User-Agent", user_agent),
                           ("Accept-Encoding", "identity"), ("Connection", "close"), *headers.items()]
        if body is not None:
            request_headers.append(("Content-Length", str(len(body))))
        out = conn.send(h11.Request(method=method, target=target.target, headers=request_headers))
        if body is not None:
            out += conn.send(h11.Data(data=body))
        out += conn.send(h11.EndOfMessage())
        await stream.send_all(out)
        response: h11.Response | None = None
        data, total, truncated = bytearray(), 0, False
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(bytes(await stream.receive_some(_READ_CHUNK)))
                continue
            if isinstance(event, h11.Response):
                response = event
                on_status(event.status_code)
            elif isinstance(event, h11.Data):
                total += len(event.data)
                room = limit - len(data)
                data += event.data[:max(room, 0)]
                if total > limit:
                    truncated = True
                    break
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                break
        if response is None:  # h11 raises for a connection closed early; this is only a guard
            raise ToolError(ErrorCode.NETWORK_ERROR, f"{target.url!r}: {target.host} sent no response")
        return _Response(response.status_code,
                         [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in response.headers],
                         data, total, truncated)

    async def _request(self, target: Target, method: str, headers: Mapping[str, str], body: bytes | None,
                       limit: int, scope: _Scope, user_agent: str = _USER_AGENT,
                       on_status: Callable[[int], None] = lambda status: None) -> _Response:
        import h11

        addresses = await self._addresses(target, scope)
        stream = await self._connect(target, addresses)
        try:
            return await self._exchange(stream, target, method, headers, body, limit, user_agent, on_status)
        except (trio.BrokenResourceError, OSError, h11.ProtocolError, ssl.SSLError) as exc:
            raise ToolError(ErrorCode.NETWORK_ERROR,
                            f"{target.url!r}: the exchange with {target.host} failed: {exc or type(exc).__name__}") from None
        finally:
            await trio.aclose_forcefully(stream)

    def _scope(self, namespace: str | None) -> _Scope:
        lookup = self.policy.namespace_hosts
        if namespace is None or lookup is None:
            return _Scope(namespace, None)
        try:
            return _Scope(namespace, lookup(namespace))
        except (OSError, ValueError) as exc:  # a broken settings file: refuse rather than fetch unnarrowed
            log.error("http.fetch: the egress policy of namespace %s cannot be read: %s", namespace, exc)
            raise _refused(f"http.fetch: namespace {namespace!r}'s egress policy cannot be read; "
                           "the operator must fix it") from None

    async def fetch(self, args: FetchInput, limit: int, namespace: str | None = None,
                    ) -> tuple[Target, _Response, list[str]]:
        """Follow up to ``MAX_REDIRECTS`` redirects, each checked from the start; the last response."""
        scope = self._scope(namespace)
        if args.method == "POST" and not self.policy.egress.allow_post:
            raise _refused("http.fetch: POST is not allowed here (the operator enables it with --allow-fetch-post); "
                           "use GET or HEAD")
        if args.body is not None and args.method != "POST":
            raise ToolError(ErrorCode.INVALID_INPUT, f"http.fetch: a body goes with POST only, not {args.method}")
        target = parse_target(args.url)
        method, headers = args.method, dict(args.headers)
        body = args.body.encode("utf-8") if args.body is not None else (b"" if method == "POST" else None)
        visited: list[str] = []
        while True:
            response = await self._request(target, method, headers, body, limit, scope)
            location = response.header("location")
            if response.status not in _REDIRECTS or location is None:
                return target, response, visited
            visited.append(target.url)
            if len(visited) > MAX_REDIRECTS:
                raise ToolError(ErrorCode.NETWORK_ERROR, f"{args.url!r}: more than {MAX_REDIRECTS} redirects "
                                f"(the last to {location!r}); not followed further")
            following = parse_target(urljoin(target.url, location))
            same_origin = (following.scheme, following.host, following.port) == (target.scheme, target.host,
                                                                                 target.port)
            if response.status == 303 or (response.status in (301, 302) and method == "POST"):
                method, body = "GET", None
            elif method == "POST" and not same_origin:  # 307/308 would re-send the body somewhere else
                raise ToolError(ErrorCode.NETWORK_ERROR, f"{args.url!r}: the POST was redirected to another origin "
                                f"({following.url!r}); its body is not sent there — post to that URL if it is meant")
            if not same_origin:
                headers = {}  # what the call meant for one origin (a token) is not sent to another, nor in clear
            target = following

    async def post_once(self, url: str, headers: Mapping[str, str], body: bytes, limit: int,
                        user_agent: str, who: str, on_status: Callable[[int], None] = lambda status: None,
                        ) -> tuple[int, bytes]:
        """One POST to ``url``, checked and connected exactly as a fetch (no redirect followed, whatever
        ``allow_post`` says: the caller is the service itself, a webhook sender, named ``who`` in errors); its status
        and the first ``limit`` bytes of its body. ``on_status`` hears the status as soon as it comes (before the
        body: a caller that gives up waiting for the body still knows it). ``ToolError`` as ``fetch``."""
        response = await self._request(parse_target(url, who), "POST", headers, body, limit, _Scope(None, None, who),
                                        user_agent, on_status)
        return response.status, bytes(response.body)

    async def run(self, args: FetchInput, ctx: ToolContext) -> ToolResult:
        limit = min(args.max_bytes or ctx.limits.fetch_max_bytes, ctx.limits.fetch_max_bytes)
        timeout = ctx.limits.fetch_timeout_s
        by = f"namespace:{ctx.namespace or '-'}"
        try:
            with trio.fail_after(timeout):
                target, response, redirects = await self.fetch(args, limit, ctx.namespace)
        except trio.TooSlowError:
            audit("tool.http_fetch", by, url=args.url, method=args.method, outcome="timeout")
            raise ToolError(ErrorCode.TIMEOUT, f"{args.url!r}: no complete answer within {timeout:g}s; "
                            "the request was abandoned") from None
        except ToolError as exc:
            audit("tool.http_fetch", by, url=args.url, method=args.method, outcome=exc.code.value)
            raise
        result = await self._result(args, target, response, redirects, ctx)
        audit("tool.http_fetch", by, url=args.url, method=args.method, final_url=target.url,
              status=response.status, bytes=response.total, truncated=response.truncated, outcome="ok")
        return result

    async def _result(self, args: FetchInput, target: Target, response: _Response, redirects: list[str],
                      ctx: ToolContext) -> ToolResult:
        content_type = response.header("content-type") or ""
        body = bytes(response.body)
        body_ref = await ctx.put_blob(body, content_type or "application/octet-stream") \
            if body and ctx.put_blob is not None else None
        text: str | None = None
        if body and _is_text(content_type):
            try:
                decoded = body.decode(_charset(content_type), errors="replace")
            except (LookupError, ValueError):  # the server's charset is no text encoding ("rot13", "idna" …)
                decoded = body.decode("utf-8", errors="replace")
            text = clip(decoded, TEXT_PREVIEW_CHARS)
        content: dict[str, JsonValue] = {
            "url": args.url,
            "final_url": target.url,
            "status": response.status,
            "headers": {k: v for k, v in response.headers if k in SAFE_RESPONSE_HEADERS},
            "content_type": content_type,
            "bytes": len(body),
            "truncated": response.truncated,
            "body_ref": body_ref,
            "text": text,
        }
        if redirects:
            content["redirects"] = list(redirects)
        if response.truncated:
            content["note"] = f"the body was cut at {len(body)} bytes (max_bytes); the rest was not read"
        elif body and text is None:
            content["note"] = f"{content_type or 'unknown content type'}: no text preview; the body is in body_ref"
        summary = f"{args.method} {target.url}: {response.status}, {len(body)} bytes" + \
            (" (truncated)" if response.truncated else "")
        return ToolResult(
            content=content,
            is_error=response.status >= 400,
            preview=clip(f"{summary}\n{text or ''}"),
            # not sandboxed: confined by the egress policy, which the sandbox summary has no word for
            sandbox=SandboxSummary(kind="none", network=True, time_limit_s=ctx.limits.fetch_timeout_s),
            execution_env="supervisor:network",
            output_ref=body_ref,
        )


def make_fetch_tool(policy: FetchPolicy) -> Tool[FetchInput]:
    runner = FetchTool(policy)
    post = " or POST" if policy.egress.allow_post else ""
    return Tool(
        name=FETCH_TOOL_NAME,
        description=(
            f"Fetch a URL with GET, HEAD{post} from the supervisor's host. Only these hosts are allowed: "
            f"{policy.egress.describe_hosts()}; private, loopback and link-local addresses never are. The body is "
            "size- and time-limited; text, JSON and XML bodies come back as text."
        ),
        input_model=FetchInput,
        tool_class=ToolClass.NETWORK,
        run=runner.run,
        execution_env="supervisor:network",
        sandbox_kind="none",
    )
