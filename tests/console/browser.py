"""Driving the console in Debian's headless Chromium (Playwright for Python), against a supervisor on 127.0.0.1.

Playwright's sync API runs in a thread of its own (``trio.to_thread``) while the supervisor serves in the test's trio
loop. Every request the browser makes is recorded; any not to the server's own origin is aborted, and the tests
assert there was none. Waits are Playwright's: for a condition, with a hang guard, never a sleep."""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx2 as httpx
import pytest
import trio

from codesdk.supervisor.api import TokenAuth
from codesdk.supervisor.api.server import serve_api
from codesdk.supervisor.engine import Engine
from codesdk.supervisor.service.serve import webhook_service
from codesdk.supervisor.webhooks import WebhookOptions

from tests.conftest import MakeEngine
from tests.waits import HANG_GUARD_S

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext, Page, Request, Route

REPO = Path(__file__).resolve().parents[2]
#: Where the tests leave a screenshot of each page, for a reviewer to look at.
SCREENSHOTS = REPO / "build" / "console-screenshots"
#: Playwright's waits: a hang guard only a broken console reaches, never a measure of speed.
WAIT_MS = HANG_GUARD_S * 1000
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


def chromium() -> str:
    """The Chromium on PATH; the test is skipped, saying what to install, where there is none or no Playwright."""
    if importlib.util.find_spec("playwright") is None:
        pytest.skip("Playwright for Python is not installed (pip install -e '.[test]' installs playwright==1.58.0)")
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("no chromium on PATH: the console's browser tests drive Debian's (apt-get install chromium; "
                    ".ci/run installs it)")
    return path


@dataclass
class Served:
    engine: Engine
    base: str  # http://127.0.0.1:<port>, the server's own origin
    admin: str
    alice: str
    bob: str

    def client(self, token: str) -> httpx.Client:
        return httpx.Client(base_url=self.base, headers={"Authorization": f"Bearer {token}"}, timeout=HANG_GUARD_S)


@asynccontextmanager
async def serve_on_loopback(make_engine: MakeEngine, tmp_path: Path,
                            webhooks: WebhookOptions | None = None) -> AsyncIterator[Served]:
    """A supervisor's API on 127.0.0.1 (a port of the kernel's choosing), with admin, alice and bob tokens; with
    ``webhooks``, its webhooks and their delivery loop as the service runs them."""
    data_dir = tmp_path / "data"
    async with make_engine(data_dir=data_dir) as engine:
        auth = TokenAuth.bootstrap(data_dir)
        admin = (data_dir / "admin.token").read_text().strip()
        alice = auth.add_principal("alice", ["user:alice"])
        bob = auth.add_principal("bob", ["user:bob"])
        async with trio.open_nursery() as nursery:
            hooks = None
            if webhooks is not None:
                hooks = webhook_service(engine, webhooks)
                await nursery.start(hooks.run)
            binds = await nursery.start(partial(serve_api, engine, auth, None, 0, webhooks=hooks))
            base = next(b for b in binds if b.startswith("http://127.0.0.1:"))
            yield Served(engine, base, admin, alice, bob)
            nursery.cancel_scope.cancel()


@dataclass
class Browser:
    """One browser context on an empty profile; ``requests``: every URL it asked for, ``foreign``: those not to
    the server's origin (aborted)."""
    context: BrowserContext
    page: Page
    origin: str
    requests: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    #: Errors the page's script threw, and what the browser reported (a CSP violation among them).
    errors: list[str] = field(default_factory=list)

    def shot(self, name: str) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)

    def login(self, token: str) -> None:
        from playwright.sync_api import expect

        self.page.goto(f"{self.origin}/console/")
        self.page.fill("#token", token)
        self.page.click("#login")
        expect(self.page.locator("#logout")).to_be_visible()


@contextmanager
def browser(origin: str) -> Iterator[Browser]:
    from playwright.sync_api import expect, sync_playwright

    executable = chromium()
    expect.set_options(timeout=WAIT_MS)
    with sync_playwright() as playwright, tempfile.TemporaryDirectory(prefix="codesdk-chromium.") as profile:
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=executable, headless=True, args=CHROMIUM_ARGS, accept_downloads=True,
            viewport={"width": 1400, "height": 1000})
        try:
            context.set_default_timeout(WAIT_MS)
            opened = Browser(context, context.pages[0] if context.pages else context.new_page(), origin)

            def guard(route: Route, request: Request) -> None:
                opened.requests.append(request.url)
                parts = urlsplit(request.url)
                if parts.scheme == "data" or f"{parts.scheme}://{parts.netloc}" == origin:
                    route.continue_()
                else:
                    opened.foreign.append(request.url)
                    route.abort()

            context.route("**/*", guard)
            opened.page.on("pageerror", lambda error: opened.errors.append(f"page error: {error}"))
            opened.page.on("console", lambda message: opened.errors.append(f"console: {message.text}")
                           if message.type == "error" else None)
            yield opened
        finally:
            context.close()


def fetch_from_page(page: Page, method: str, path: str, csrf: bool = True, body: Any = None) -> int:
    """The status of a request the page's own script could forge: same origin, the cookie, the CSRF token it
    holds in memory (read back from the console session, as the page does) unless ``csrf`` is False."""
    return int(page.evaluate(
        """async ([method, path, csrf, body]) => {
             const who = await (await fetch("/console/session")).json();
             const headers = {"Content-Type": "application/json"};
             if (csrf) headers["X-CSRF-Token"] = who.csrf_token;
             const r = await fetch(path, {method, headers, body: body === null ? undefined : JSON.stringify(body)});
             return r.status;
           }""", [method, path, csrf, body]))
