"""The console's login, cookie, CSRF and headers over plain HTTP (no browser): they hold wherever the suite runs."""

from __future__ import annotations

from typing import Any

import trio
from hypothesis import given
from hypothesis import strategies as st
from starlette.requests import Request

from codesdk.supervisor.api._console import cross_site
from codesdk.supervisor.console import ACTIVE_S, CSP, IDLE_S, LIFETIME_S, PER_TOKEN, POLL_S, ConsoleSessions

from tests.api.conftest import Api

ORIGIN = "http://codesdk"  # the test client's base URL: the server's own origin as a browser would send it


async def _login(api: Api, token: str) -> tuple[str, str]:
    """(cookie value, CSRF token) of a new console session."""
    r = await api.client.post("/console/session", json={"token": token}, headers={"Origin": ORIGIN})
    assert r.status_code == 201, r.text
    api.client.cookies.clear()  # each test says which cookie it sends
    cookie = r.headers["set-cookie"].split(";")[0].split("=", 1)[1]
    return cookie, str(r.json()["csrf_token"])


def _cookie(value: str) -> dict[str, str]:
    return {"Cookie": f"codesdk_console={value}"}


async def test_the_page_is_served_with_a_strict_policy(api: Api) -> None:
    for path, media in (("/console/", "text/html"), ("/console/app.js", "text/javascript"),
                        ("/console/app.css", "text/css")):
        r = await api.client.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith(media)
        assert r.headers["content-security-policy"] == CSP
        assert r.headers["x-content-type-options"] == "nosniff" and r.headers["x-frame-options"] == "DENY"
        assert r.headers["referrer-policy"] == "no-referrer"
    page = (await api.client.get("/console/")).text
    assert "<script" in page and 'src="/console/app.js"' in page
    assert "http://" not in page and "https://" not in page and "style=" not in page  # nothing from outside, inline
    assert (await api.client.get("/console/../api-tokens.json")).status_code == 404
    assert (await api.client.get("/console/other.js")).status_code == 404
    moved = await api.client.get("/console")
    assert moved.status_code == 308 and moved.headers["location"] == "/console/"


async def test_login_sets_an_httponly_strict_cookie(api: Api) -> None:
    r = await api.client.post("/console/session", json={"token": api.alice}, headers={"Origin": ORIGIN})
    assert r.status_code == 201, r.text
    flags = [part.strip().lower() for part in r.headers["set-cookie"].split(";")]
    assert flags[0].startswith("codesdk_console=") and len(flags[0]) > 40
    assert {"httponly", "samesite=strict", "path=/"} <= set(flags)
    assert "secure" not in flags  # plain HTTP here; over TLS it is Secure
    body = r.json()
    assert body["principal"] == {"name": "alice", "admin": False, "namespaces": ["user:alice"]}
    assert api.alice not in r.text and body["csrf_token"]
    assert r.headers["content-security-policy"] == CSP and r.headers["cache-control"] == "no-store"


async def test_behind_a_tls_proxy_the_cookie_is_secure(api: Api) -> None:
    proxied = {"X-Forwarded-Proto": "https", "Origin": "https://codesdk"}
    r = await api.client.post("/console/session", json={"token": api.alice}, headers=proxied)
    assert r.status_code == 201, r.text
    assert "secure" in [part.strip().lower() for part in r.headers["set-cookie"].split(";")]
    plain = await api.client.post("/console/session", json={"token": api.alice},
                                  headers={"X-Forwarded-Proto": "https", "Origin": "http://codesdk"})
    assert plain.status_code == 403  # the page came over https: an http origin is another's


async def test_bad_logins_are_refused(api: Api) -> None:
    r = await api.client.post("/console/session", json={"token": "csk_not-a-token"})
    assert r.status_code == 401 and "set-cookie" not in r.headers
    assert (await api.client.post("/console/session", json={})).status_code == 422
    assert (await api.client.post("/console/session", json={"token": "x" * 10_000})).status_code == 413
    form = await api.client.post("/console/session", data={"token": api.alice})  # a cross-site form could send it
    assert form.status_code == 415
    elsewhere = await api.client.post("/console/session", json={"token": api.alice},
                                      headers={"Origin": "https://evil.example"})
    assert elsewhere.status_code == 403 and "set-cookie" not in elsewhere.headers
    metrics = api.tokens.add_principal("prom", [], metrics=True)
    assert (await api.client.post("/console/session", json={"token": metrics})).status_code == 403


async def test_the_cookie_is_the_tokens_principal(api: Api) -> None:
    mine = await api.create_session(api.alice, "user:alice")
    theirs = await api.create_session(api.bob, "user:bob")
    cookie, _ = await _login(api, api.alice)
    listed = await api.client.get("/v1/sessions", headers=_cookie(cookie))
    assert [s["session_id"] for s in listed.json()["sessions"]] == [mine["session_id"]]
    assert (await api.client.get(f"/v1/sessions/{theirs['session_id']}", headers=_cookie(cookie))).status_code == 404
    assert (await api.client.get("/v1/workers", headers=_cookie(cookie))).status_code == 403
    assert (await api.client.get("/v1/sessions", headers=_cookie("forged"))).status_code == 401
    who = await api.client.get("/console/session", headers=_cookie(cookie))
    assert who.status_code == 200 and who.json()["principal"]["name"] == "alice"


async def test_a_change_needs_the_csrf_header_and_our_origin(api: Api) -> None:
    cookie, csrf = await _login(api, api.alice)
    body: dict[str, Any] = {"namespace": "user:alice"}
    bare = await api.client.post("/v1/sessions", json=body, headers=_cookie(cookie))
    assert bare.status_code == 403 and bare.json()["error"]["code"] == "csrf_failed"
    wrong = await api.client.post("/v1/sessions", json=body, headers=_cookie(cookie) | {"X-CSRF-Token": "x" + csrf})
    assert wrong.status_code == 403
    good = _cookie(cookie) | {"X-CSRF-Token": csrf}
    far = await api.client.post("/v1/sessions", json=body, headers=good | {"Origin": "https://evil.example"})
    assert far.status_code == 403 and "evil.example" in far.json()["error"]["message"]
    site = await api.client.post("/v1/sessions", json=body, headers=good | {"Sec-Fetch-Site": "cross-site"})
    assert site.status_code == 403
    listed = await api.client.get("/v1/sessions", headers=_cookie(cookie))
    assert listed.json()["sessions"] == []  # none of the refused requests made one
    made = await api.client.post("/v1/sessions", json=body, headers=good | {"Origin": ORIGIN,
                                                                           "Sec-Fetch-Site": "same-origin"})
    assert made.status_code == 201, made.text
    # A bearer token is no ambient credential: its requests need no CSRF header, a cookie beside it or not.
    bearer = await api.client.post("/v1/sessions", json=body, headers=_cookie(cookie) | api.auth(api.alice))
    assert bearer.status_code == 201


async def test_logout_ends_the_session(api: Api) -> None:
    cookie, csrf = await _login(api, api.alice)
    assert (await api.client.delete("/console/session", headers=_cookie(cookie))).status_code == 403
    out = await api.client.delete("/console/session", headers=_cookie(cookie) | {"X-CSRF-Token": csrf})
    assert out.status_code == 204 and "codesdk_console=" in out.headers["set-cookie"]
    assert "max-age=0" in out.headers["set-cookie"].lower()
    assert (await api.client.get("/v1/sessions", headers=_cookie(cookie))).status_code == 401
    assert (await api.client.get("/console/session", headers=_cookie(cookie))).status_code == 401


async def test_a_revoked_token_ends_its_console_sessions(api: Api) -> None:
    cookie, _ = await _login(api, api.alice)
    assert (await api.client.get("/v1/sessions", headers=_cookie(cookie))).status_code == 200
    api.tokens.revoke("alice")
    assert (await api.client.get("/v1/sessions", headers=_cookie(cookie))).status_code == 401


async def test_the_event_stream_takes_the_cookie(api: Api) -> None:
    session = await api.create_session(api.alice, "user:alice")
    other = await api.create_session(api.bob, "user:bob")
    await api.run_task(api.alice, session["session_id"])
    cookie, _ = await _login(api, api.alice)
    with trio.fail_after(60):
        r = await api.client.get(f"/v1/sessions/{session['session_id']}/events/stream?until_terminal=true",
                                 headers=_cookie(cookie))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert "event: session.created" in r.text and "event: task.completed" in r.text
    hidden = await api.client.get(f"/v1/sessions/{other['session_id']}/events/stream", headers=_cookie(cookie))
    assert hidden.status_code == 404


async def test_tokens_api(api: Api) -> None:
    admin = api.auth(api.admin)
    listed = (await api.client.get("/v1/tokens", headers=admin)).json()["tokens"]
    assert {t["name"] for t in listed} == {"admin", "alice", "bob"}
    assert all("sha256" not in t and "secret" not in t for t in listed)
    assert (await api.client.get("/v1/tokens", headers=api.auth(api.alice))).status_code == 403
    made = await api.client.post("/v1/tokens", headers=admin, json={"name": "carol", "namespaces": ["user:carol"]})
    assert made.status_code == 201, made.text
    carol = made.json()
    assert carol["token"]["namespaces"] == ["user:carol"] and carol["secret"].startswith("csk_")
    assert (await api.client.get("/v1/sessions", headers=api.auth(carol["secret"]))).status_code == 200
    again = await api.client.post("/v1/tokens", headers=admin, json={"name": "carol", "namespaces": ["user:carol"]})
    assert again.status_code == 409
    bad = await api.client.post("/v1/tokens", headers=admin, json={"name": "dave", "namespaces": ["no such/ns"]})
    assert bad.status_code == 422
    assert (await api.client.post("/v1/tokens", headers=admin, json={"name": "erin"})).status_code == 422
    token_id = carol["token"]["id"]
    rotated = await api.client.post(f"/v1/tokens/{token_id}/rotate", headers=admin)
    assert rotated.status_code == 200 and rotated.json()["secret"] != carol["secret"]
    assert (await api.client.get("/v1/sessions", headers=api.auth(carol["secret"]))).status_code == 401
    assert (await api.client.delete(f"/v1/tokens/{token_id}", headers=admin)).status_code == 200
    assert (await api.client.get("/v1/sessions",
                                 headers=api.auth(rotated.json()["secret"]))).status_code == 401
    assert (await api.client.delete(f"/v1/tokens/{token_id}", headers=admin)).status_code == 404
    admin_id = next(t["id"] for t in listed if t["admin"])
    assert (await api.client.delete(f"/v1/tokens/{admin_id}", headers=admin)).status_code == 409


def test_console_sessions_expire_when_idle_and_at_their_lifetime() -> None:
    now = [1000.0]
    sessions = ConsoleSessions(clock=lambda: now[0])
    idle = sessions.open("a" * 64)
    now[0] += IDLE_S - 1
    assert sessions.find(idle.session_id) is idle  # used: its idle time starts again
    now[0] += IDLE_S - 1
    assert sessions.find(idle.session_id) is idle
    now[0] += IDLE_S
    assert sessions.find(idle.session_id) is None
    busy = sessions.open("b" * 64)
    while now[0] < busy.created + LIFETIME_S:
        assert sessions.find(busy.session_id) is busy
        now[0] += IDLE_S / 2
    assert sessions.find(busy.session_id) is None


def test_one_token_holds_a_bounded_number_of_console_sessions() -> None:
    sessions = ConsoleSessions(clock=lambda: 0.0)
    first = sessions.open("c" * 64)
    later = [sessions.open("c" * 64) for _ in range(PER_TOKEN)]
    assert sessions.find(first.session_id) is None  # the oldest made way
    assert all(sessions.find(s.session_id) is s for s in later)


def _request(headers: dict[str, str], scheme: str = "http") -> Request:
    return Request({"type": "http", "method": "POST", "scheme": scheme, "path": "/v1/sessions", "query_string": b"",
                    "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]})


@given(origin=st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=60))
def test_only_the_servers_own_origin_passes(origin: str) -> None:
    why = cross_site(_request({"host": "127.0.0.1:8700", "origin": origin}))
    assert (why is None) == (origin == "http://127.0.0.1:8700")


@given(site=st.sampled_from(["same-origin", "none", "same-site", "cross-site", "other"]))
def test_a_browser_saying_another_site_is_refused(site: str) -> None:
    why = cross_site(_request({"host": "127.0.0.1:8700", "sec-fetch-site": site}))
    assert (why is None) == (site in ("same-origin", "none"))


def test_a_console_session_is_active_while_it_polls() -> None:
    now = [1000.0]
    sessions = ConsoleSessions(clock=lambda: now[0])
    seen: list[float] = []
    sessions.on_seen = lambda: seen.append(now[0])
    polling = sessions.open("a" * 64)
    idle = sessions.open("b" * 64)
    assert {s.session_id for s in sessions.active()} == {polling.session_id, idle.session_id}
    for _ in range(10):  # the console's poll, for a while
        now[0] += POLL_S
        assert sessions.find(polling.session_id) is polling
    assert [s.session_id for s in sessions.active()] == [polling.session_id]  # the other one stopped polling
    assert len(seen) == 12  # each login and poll told the service someone may be there
    sessions.close(polling.session_id)
    assert sessions.active() == []
    late = sessions.open("c" * 64)
    now[0] += ACTIVE_S
    assert sessions.active() == [] and sessions.find(late.session_id) is late  # idle a while: live, not watching


async def test_a_polling_console_is_someone_for_its_namespaces(api: Api) -> None:
    cookie, csrf = await _login(api, api.alice)
    assert (await api.client.get("/v1/approvals", headers=_cookie(cookie))).status_code == 200
    assert api.engine.audience.consoles("user:alice") == 1 and api.engine.audience.consoles("user:bob") == 0
    r = await api.client.delete("/console/session", headers={**_cookie(cookie), "X-CSRF-Token": csrf,
                                                             "Origin": ORIGIN})
    assert r.status_code == 204
    assert api.engine.audience.consoles("user:alice") == 0
