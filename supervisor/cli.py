"""``codesdk`` command line (interim: drives one worker directly; the supervisor-backed CLI replaces it)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path

import trio

from protocol import TERMINAL_EVENT_TYPES, EventType, Method
from supervisor.workers import RpcError, WorkerError, WorkerProcess, WorkerSpec, worker_argv


def _render(event_type: str, payload: dict) -> str | None:
    if event_type == EventType.MODEL_OUTPUT_DELTA:
        return None
    return f"[{event_type}] {json.dumps(payload, ensure_ascii=False)[:200]}"


async def _run(args: argparse.Namespace) -> int:
    home = Path(tempfile.mkdtemp(prefix="codesdk-home-"))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8"}
    spec = WorkerSpec(argv=worker_argv(), env=env, name="worker:default")
    async with trio.open_nursery() as nursery:
        worker = await WorkerProcess.start(nursery, spec)
        try:
            task_id = f"task_{uuid.uuid4().hex[:12]}"
            await worker.connection.request(Method.START_TASK, {
                "runtime": args.runtime, "session": {"session_id": f"sess_{uuid.uuid4().hex[:12]}"},
                "task_id": task_id, "runtime_config": {"scenario": args.scenario},
                "messages": [{"role": "user", "blocks": [{"type": "text", "text": args.prompt}]}]})
            async for params in worker.connection.events:
                event = params.event
                if args.json:
                    print(json.dumps(params.to_json_obj(), ensure_ascii=False), flush=True)
                elif event.type == EventType.MODEL_OUTPUT_DELTA:
                    print(event.payload.delta, end="", flush=True)  # type: ignore[attr-defined]
                else:
                    print(f"\n[{event.type}]", flush=True)
                if event.type in TERMINAL_EVENT_TYPES:
                    return 0 if event.type == EventType.TASK_COMPLETED else 1
            print("codesdk: the worker ended before the task finished", file=sys.stderr)
            return 1
        except RpcError as exc:
            print(f"codesdk: {exc.message}", file=sys.stderr)
            return 2
        except WorkerError as exc:
            print(f"codesdk: {exc}", file=sys.stderr)
            return 1
        finally:
            await worker.shutdown()
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="codesdk", description="CodeSDK command line")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one prompt as a task and stream its events")
    run.add_argument("prompt")
    run.add_argument("--runtime", default="scripted")
    run.add_argument("--scenario", default="echo")
    run.add_argument("--json", action="store_true", help="print events as JSON lines")
    args = parser.parse_args(argv)
    return trio.run(_run, args)


if __name__ == "__main__":
    sys.exit(main())
