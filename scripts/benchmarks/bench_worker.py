"""``codesdk-worker`` plus one measuring runtime, ``bench``, for cases that need timestamps taken inside the worker.

The scripted runtime cannot say *when* it emitted an event or how long a tool call took from its side, so the
benchmark starts workers with this entry point instead: the real worker (same server, same adapters) with one
extra adapter. ``runtime_config``:

- ``{"paced": COUNT, "rate": PER_SECOND}``: COUNT deltas at a fixed offered rate; each delta's text is the
  wall-clock time (``time.time_ns()``) at which it was emitted, so a subscriber can compute the latency.
- ``{"tool_calls": COUNT, "path": P}``: COUNT sequential ``workspace.read`` calls; each is timed from just before
  ``tool.call.requested`` is emitted to the result arriving back here. The timings (seconds) come back as one
  JSON-array delta before the task completes.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _bench_adapter() -> Any:
    """Built lazily, after the worker has claimed stdout (as worker.main does for its own imports)."""
    import trio

    from codesdk.protocol import (
        AuthState,
        AuthStatus,
        EventType,
        ExecutedBy,
        ModelOutputDelta,
        RuntimeCapabilities,
        StartTaskParams,
        ToolCallRequested,
        canonical_hash,
    )
    from codesdk.worker.adapters._tool_calls import PendingToolCalls, ToolOutcome
    from codesdk.worker.adapters.base import RuntimeAdapter, TaskHandle, TaskIO, TaskOutcome

    class BenchHandle(TaskHandle):
        def __init__(self, params: StartTaskParams, io: TaskIO) -> None:
            self.params, self.io = params, io
            self.tools = PendingToolCalls()

        async def run(self) -> TaskOutcome:
            config = self.params.runtime_config
            if "paced" in config:
                await self._paced(int(config["paced"]), float(config["rate"]))
            else:
                await self._tool_loop(int(config["tool_calls"]), str(config.get("path", "f.txt")))
            return TaskOutcome.success()

        async def _paced(self, count: int, rate: float) -> None:
            start = trio.current_time()
            for index in range(count):
                await trio.sleep_until(start + index / rate)
                await self.io.emit(EventType.MODEL_OUTPUT_DELTA,
                                   ModelOutputDelta(block_id="paced", delta=str(time.time_ns()), index=index))

        async def _tool_loop(self, count: int, path: str) -> None:
            timings = []
            tool_input = {"path": path}
            for index in range(count):
                call_id = f"call{index}"
                self.tools.expect(call_id)
                started = time.perf_counter()
                await self.io.emit(EventType.TOOL_CALL_REQUESTED, ToolCallRequested(
                    tool_call_id=call_id, runtime_tool_call_id=call_id, input_hash=canonical_hash(tool_input),
                    tool_name="workspace.read", input=tool_input, executed_by=ExecutedBy.SUPERVISOR))
                outcome = await self.tools.wait(call_id)
                timings.append(time.perf_counter() - started)
                if outcome.denied or outcome.is_error:
                    raise RuntimeError(f"tool call {call_id} was not answered with a result: {outcome}")
            await self.io.emit(EventType.MODEL_OUTPUT_DELTA,
                               ModelOutputDelta(block_id="timings", delta=json.dumps(timings)))

        def send_tool_result(self, tool_call_id: str, result: Any, is_error: bool = False) -> None:
            self.tools.answer(tool_call_id, ToolOutcome(result=result, is_error=is_error))

        def send_tool_denied(self, tool_call_id: str, reason: str) -> None:
            self.tools.answer(tool_call_id, ToolOutcome(denied=True, reason=reason))

        def stop(self, reason: str | None) -> None:
            pass

    class BenchAdapter(RuntimeAdapter):
        name = "bench"

        def capabilities(self) -> RuntimeCapabilities:
            return RuntimeCapabilities(name=self.name, version="1", requires_auth=False, tool_calls=True)

        async def auth_status(self) -> AuthStatus:
            return AuthStatus(runtime=self.name, state=AuthState.NOT_REQUIRED, method="none", message="none needed")

        def start_task(self, params: StartTaskParams, io: TaskIO) -> TaskHandle:
            return BenchHandle(params, io)

    return BenchAdapter()


def main() -> int:
    import codesdk.worker.main
    from codesdk.worker.adapters import registry
    from codesdk.worker.adapters.runtime_process import RuntimeAhead

    default_registry = registry.default_registry

    def with_bench(scenario_dir: Path | None = None, ahead: RuntimeAhead | None = None) -> Any:
        registry = default_registry(scenario_dir, ahead)
        registry.add(_bench_adapter())
        return registry

    registry.default_registry = with_bench  # type: ignore[assignment]  # read by worker._stdio at run time
    return codesdk.worker.main.main()


if __name__ == "__main__":
    sys.exit(main())
