"""One subscriber process of case 16 (``streams``): holds many SSE streams of ``codesdk-supervisor serve``.

    python streams_subscriber.py SPEC.json OUT.json

SPEC: ``{"socket": PATH, "guard_s": S, "streams": [[token, session_id, after_seq], ...]}``. Each stream is a real
HTTP request over the unix socket (``GET /v1/sessions/{id}/events/stream?until_terminal=true``), read as raw
bytes: each ``paced`` delta's text is its emit time (``time.time_ns()`` in the worker), taken with a regular
expression from the frame rather than by building an event model, so that this process stays far from being the
bottleneck (its CPU share is reported, to show it kept up). Prints ``ready`` once every stream's response has
started; exits when every stream has ended (the service ends each after its task's terminal event). OUT: per
stream, the ``[emitted_ns, received_ns]`` pairs; and this process's CPU seconds and wall seconds.
"""

from __future__ import annotations

import json
import re
import resource
import sys
import time
from typing import Any

import httpx2 as httpx
import trio

_DELTA = re.compile(rb'"block_id"\s*:\s*"paced"[^\n]*?"delta"\s*:\s*"(\d+)"'
                    rb'|"delta"\s*:\s*"(\d+)"[^\n]*?"block_id"\s*:\s*"paced"')


def emitted_times(data: bytes) -> tuple[list[int], bytes]:
    """The emit times (ns) carried by the ``paced`` deltas in the complete SSE frames of ``data`` (in either key
    order), and the bytes after the last complete frame (the start of the next, to prepend to the next chunk)."""
    cut = data.rfind(b"\n\n") + 2 if b"\n\n" in data else 0
    return [int(match.group(1) or match.group(2)) for match in _DELTA.finditer(data, 0, cut)], data[cut:]


async def _follow(client: httpx.AsyncClient, token: str, session: str, after: int, pairs: list[list[int]],
                  started: trio.Event, remaining: list[int]) -> None:
    async with client.stream("GET", f"/v1/sessions/{session}/events/stream",
                             params={"after_seq": after, "until_terminal": "true"},
                             headers={"Authorization": f"Bearer {token}"}) as response:
        if response.status_code != 200:
            raise RuntimeError(f"stream of {session}: HTTP {response.status_code} {(await response.aread())[:300]!r}")
        remaining[0] -= 1
        if remaining[0] == 0:
            started.set()
        tail = b""
        async for chunk in response.aiter_bytes():
            received = time.time_ns()
            emitted, tail = emitted_times(tail + chunk)
            pairs.extend([sent, received] for sent in emitted)


async def main(spec_path: str, out_path: str) -> None:
    with open(spec_path) as spec_file:
        spec = json.load(spec_file)
    streams = spec["streams"]
    results: list[list[list[int]]] = [[] for _ in streams]
    started = trio.Event()
    remaining = [len(streams)]
    wall = time.perf_counter()
    transport = httpx.AsyncHTTPTransport(uds=spec["socket"], limits=httpx.Limits(max_connections=None,
                                                                                  max_keepalive_connections=None))
    async with httpx.AsyncClient(transport=transport, base_url="http://codesdk",
                                 timeout=httpx.Timeout(30.0, read=None)) as client:
        with trio.fail_after(float(spec["guard_s"])):
            async with trio.open_nursery() as nursery:
                for index, (token, session, after) in enumerate(streams):
                    nursery.start_soon(_follow, client, token, session, int(after), results[index], started,
                                       remaining)
                await started.wait()
                print("ready", flush=True)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out: dict[str, Any] = {"pairs": results, "cpu_s": usage.ru_utime + usage.ru_stime,
                           "wall_s": time.perf_counter() - wall}
    with open(out_path, "w") as out_file:
        json.dump(out, out_file)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
