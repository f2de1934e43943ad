"""The console in a real headless Chromium against a real supervisor (scripted runtime): a tenant watches a task
live, approves, denies and stops; it cannot see or touch another tenant's session; the admin's pages work. Each
page's screenshot is left in build/console-screenshots/."""

from __future__ import annotations

import json
from pathlib import Path
import trio
from standardwebhooks import Webhook

from tests.conftest import MakeEngine
from tests.console.browser import Browser, Served, browser, chromium, fetch_from_page, serve_on_loopback
from tests.waits import HANG_GUARD_S
from tests.webhooks.conftest import allowing, started
from tests.webhooks.receiver import Receiver


def _script_errors(b: Browser) -> list[str]:
    """What the page's script threw or the browser refused (a CSP violation is one); a status the API answered
    (the forged requests' 404s) is no error of the page."""
    return [e for e in b.errors if "Failed to load resource" not in e]


def _tenant_scenario(served: Served) -> None:
    from playwright.sync_api import expect

    with served.client(served.alice) as alice, served.client(served.bob) as bob:
        mine = alice.post("/v1/sessions", json={"namespace": "user:alice"}).json()["session_id"]
        theirs = bob.post("/v1/sessions", json={"namespace": "user:bob"}).json()["session_id"]
        their_task = bob.post(f"/v1/sessions/{theirs}/tasks", json={"prompt": "hi", "runtime_config": {
            "scenario": "echo"}}).json()["task_id"]

        def start(scenario: str) -> str:
            r = alice.post(f"/v1/sessions/{mine}/tasks", json={
                "prompt": scenario, "interaction_mode": "interactive", "runtime_config": {"scenario": scenario}})
            assert r.status_code == 202, r.text
            return str(r.json()["task_id"])

        with browser(served.base) as b:
            page = b.page
            answer = page.goto(f"{served.base}/console/")
            assert answer is not None and answer.headers["content-security-policy"].startswith("default-src 'none'")
            expect(page.locator("#token")).to_be_visible()
            b.shot("login")
            b.login(served.alice)

            [cookie] = b.context.cookies()
            assert (cookie["name"], cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (
                "codesdk_console", True, "Strict", "/")
            assert page.evaluate("document.cookie") == ""  # HttpOnly: no script of the page reads it

            expect(page.locator('#nav a[href="#/workers"]')).to_be_hidden()  # the admin's pages: not a tenant's
            expect(page.locator('#nav a[href="#/tokens"]')).to_be_hidden()
            # Sessions: only alice's, searchable.
            expect(page.locator(f'tr.session[data-session="{mine}"]')).to_be_visible()
            assert theirs not in page.content()
            b.shot("sessions")
            page.fill("#filter-q", "no such prompt")
            page.click("#session-filters button[type=submit]")
            expect(page.locator("tr.session")).to_have_count(0)
            page.goto(f"{served.base}/console/#/sessions?state=all")
            page.click(f'tr.session[data-session="{mine}"] a')

            # A task started once the page follows the session: its events arrive live, over the event stream.
            expect(page.locator("#live")).to_have_text("live")
            start("write-or-deny")
            expect(page.locator('#events .event[data-type="approval.requested"]')).to_have_count(1)
            card = page.locator(".approval")
            expect(card).to_have_count(1)
            expect(page.locator('.node.waiting[data-stage="decided"]')).to_have_count(1)
            b.shot("session-waiting")
            card.locator("select.scope").select_option("task")  # a scoped grant: this tool, for this task
            card.locator("button.allow").click()
            expect(page.locator('#events .event[data-type="task.completed"]')).to_have_count(1)
            expect(page.locator('#events .event[data-type="grant.created"]')).to_have_count(1)
            expect(page.locator('.node.done[data-stage="completed"]')).to_have_count(1)
            expect(page.locator("#transcript")).to_contain_text("Wrote notes.txt")

            # Deny the next one: the runtime takes its other branch and completes.
            start("write-or-deny")
            expect(page.locator(".approval")).to_have_count(1)
            page.locator(".approval button.deny").click()
            expect(page.locator('#events .event[data-type="task.completed"]')).to_have_count(2)
            expect(page.locator('.node.bad[data-stage="decided"]')).to_have_count(1)
            expect(page.locator("#transcript")).to_contain_text("I did not write the file")

            # Stop one that would run forever.
            start("hang")
            expect(page.locator("#stop")).to_be_visible()
            b.shot("session-running")
            page.click("#stop")
            expect(page.locator('#events .event[data-type="task.stopped"]')).to_have_count(1)
            expect(page.locator("#stop")).to_have_count(0)
            # Parallel calls: side by side in one row of the task's graph.
            parallel = start("parallel-tools")
            graph = page.locator(f'.task[data-task="{parallel}"]')
            ended = '.node.done[data-stage="completed"], .node.bad[data-stage="completed"]'
            expect(graph.locator(ended)).to_have_count(2)
            expect(graph.locator(".batch")).to_have_count(1)
            expect(graph.locator(".batch .lane")).to_have_count(2)
            expect(page.locator('#events .event[data-type="task.completed"]')).to_have_count(3)

            # A runtime's question: answered from its card (a choice and free text).
            start("ask-user")
            question = page.locator(".question")
            expect(question).to_have_count(1)
            b.shot("session-question")
            question.locator('select[data-question="colour"]').select_option("red")
            question.locator('input[data-question="name"]').fill("Ada")
            question.locator("button.allow").click()
            expect(page.locator("#transcript")).to_contain_text("Colour red, name Ada.")
            expect(page.locator(".question")).to_have_count(0)
            b.shot("session")

            with page.expect_download(timeout=HANG_GUARD_S * 2000) as download:
                page.click("#bundle")
            with open(download.value.path(), "rb") as bundle:
                assert bundle.read(2) == b"\x1f\x8b"  # gzip

            page.goto(f"{served.base}/console/#/pending")
            expect(page.locator("#pending")).to_contain_text("Nothing is waiting")
            b.shot("pending")

            # Another tenant's session: not shown, and a request forged from the page gets what the API says: 404.
            page.goto(f"{served.base}/console/#/session/{theirs}")
            expect(page.locator("h1")).to_have_text("No such session")
            b.shot("other-tenant")
            assert fetch_from_page(page, "GET", f"/v1/sessions/{theirs}") == 404
            assert fetch_from_page(page, "GET", f"/v1/sessions/{theirs}/events") == 404
            assert fetch_from_page(page, "POST", f"/v1/tasks/{their_task}/stop", body={}) == 404
            assert fetch_from_page(page, "GET", "/v1/workers") == 403
            # The page's own session without the CSRF header: refused, and nothing made.
            assert fetch_from_page(page, "POST", "/v1/sessions", csrf=False, body={"namespace": "user:alice"}) == 403
            assert len(alice.get("/v1/sessions").json()["sessions"]) == 1

            page.click("#logout")
            expect(page.locator("#token")).to_be_visible()
            assert fetch_from_page(page, "GET", "/v1/sessions", csrf=False) == 401

            assert b.requests and b.foreign == [], f"requests to another origin: {b.foreign}"
            assert _script_errors(b) == []
            assert all(url.startswith(served.base + "/") or url.startswith("data:") for url in b.requests)


def _admin_scenario(served: Served, receiver: Receiver) -> None:
    from playwright.sync_api import expect

    with served.client(served.alice) as alice:  # a worker to show
        session = alice.post("/v1/sessions", json={"namespace": "user:alice"}).json()["session_id"]
        alice.post(f"/v1/sessions/{session}/tasks", json={"prompt": "hi", "runtime_config": {"scenario": "echo"}})
    with browser(served.base) as b:
        page = b.page
        b.login(served.admin)
        page.goto(f"{served.base}/console/#/workers")
        expect(page.locator('#workers tr[data-namespace="user:alice"]')).to_be_visible()
        for name, ready in (("namespaces", "#namespaces"), ("workers", "#health"), ("tokens", "#tokens")):
            page.goto(f"{served.base}/console/#/{name}")
            expect(page.locator(ready)).to_be_visible()
            b.shot(name)
        expect(page.locator("#tokens tbody tr")).to_have_count(3)  # admin, alice, bob
        page.fill("#token-add input[name=name]", "carol")
        page.fill("#token-add input[name=namespaces]", "user:carol")
        page.click("#token-add button")
        expect(page.locator("#secret .secret")).to_contain_text("csk_")
        expect(page.locator("#tokens tbody tr")).to_have_count(4)
        b.shot("tokens-added")
        _webhooks_for_real(b, receiver)
        assert b.foreign == [], f"requests to another origin: {b.foreign}"
        assert _script_errors(b) == []


def _webhooks_for_real(b: Browser, receiver: Receiver) -> None:
    """The webhooks page against the service's own webhooks: add an endpoint for every namespace (its secret shown
    once, the request carrying the CSRF header), send it a test, see the delivery delivered and its attempt; the
    receiver got it signed with the secret the page showed."""
    from playwright.sync_api import Dialog, expect

    page = b.page
    page.goto(f"{b.origin}/console/#/webhooks")
    expect(page.locator("#webhooks")).to_be_visible()
    page.fill("#webhook-add input[name=url]", receiver.url)
    page.fill("#webhook-add input[name=description]", "on call")
    page.click("#webhook-add button")
    expect(page.locator("#secret .secret")).to_contain_text("whsec_")
    secret = page.locator("#secret .secret").inner_text().strip()
    assert not page.evaluate("[...document.getElementById('main').childNodes]"
                             ".some((n) => n.nodeType === Node.TEXT_NODE && n.textContent.trim() === 'null')")
    row = page.locator("#webhooks tbody tr").filter(has_text=receiver.url)
    expect(row).to_contain_text("every namespace")
    row.locator("button", has_text="Send test").click()
    expect(page.locator("#deliveries")).to_contain_text("webhook.test")
    while not receiver.received:  # the delivery loop sends it; the page shows what the API says meanwhile
        page.wait_for_timeout(50)
    [got] = receiver.received
    Webhook(secret).verify(got.body, got.headers)
    assert json.loads(got.body)["type"] == "webhook.test"
    delivered = page.locator("#deliveries tbody tr").filter(has_text="delivered")
    while not delivered.count():  # the list is what the API said when asked: ask again until it says delivered
        row.locator("button", has_text="Deliveries").click()
        page.wait_for_timeout(50)
    delivered.locator("button", has_text="Attempts").click()
    expect(page.locator("#deliveries .card")).to_contain_text("204")
    b.shot("webhooks-delivered")
    # a second rotation within the first's overlap is refused; accepting the prompt ends that overlap instead
    asked: list[str] = []

    def accept(dialog: Dialog) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)
    secrets = [secret]
    for _ in range(2):
        row.locator("button", has_text="Rotate secret").click()
        shown = page.locator("#secret .secret")
        expect(shown).not_to_have_text(secrets[-1])
        expect(page.locator("#secret")).to_contain_text("New secret of")
        secrets.append(shown.inner_text().strip())
    assert len(set(secrets)) == 3 and len(asked) == 1 and "End that overlap now?" in asked[0]


async def test_a_tenant_watches_decides_and_stops_in_a_browser(make_engine: MakeEngine, tmp_path: Path) -> None:
    chromium()  # skipped, saying why, before anything starts
    with trio.fail_after(HANG_GUARD_S * 4):
        async with serve_on_loopback(make_engine, tmp_path) as served:
            await trio.to_thread.run_sync(_tenant_scenario, served)


async def test_the_admins_pages_in_a_browser(make_engine: MakeEngine, tmp_path: Path,
                                             nursery: trio.Nursery) -> None:
    chromium()
    receiver = await started(nursery, Receiver())
    with trio.fail_after(HANG_GUARD_S * 2):
        async with serve_on_loopback(make_engine, tmp_path, allowing(receiver)) as served:
            await trio.to_thread.run_sync(_admin_scenario, served, receiver)
