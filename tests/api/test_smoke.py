from __future__ import annotations

import trio

from tests.api.conftest import Api


async def test_healthz_without_token(api: Api) -> None:
    with trio.fail_after(10):
        r = await api.client.get("/healthz")
        assert r.status_code == 200
        assert r.json() == {"status": "ok"}
