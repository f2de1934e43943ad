"""An independent ACP client for the tests: the official Python SDK (``agent-client-protocol``, asyncio) running
``codesdk acp --url …`` over real pipes, in a thread of its own beside the trio test; every line both ways recorded
(``tee.py``) for ``wire.check_log``."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from acp import spawn_agent_process
from acp.schema import (
    AcceptElicitationResponse,
    AllowedOutcome,
    ClientCapabilities,
    DeclineElicitationResponse,
    DeniedOutcome,
    ElicitationCapabilities,
    ElicitationFormCapabilities,
    PermissionOption,
    RequestPermissionResponse,
)

from tests.waits import HANG_GUARD_S

TEE = Path(__file__).with_name("tee.py")


@dataclass
class Recorder:
    """An ACP client that records what the agent streams, and answers permission requests from a script."""

    answers: list[str] = field(default_factory=list)  # option ids, in order; "cancelled" for none, "never"
    updates: list[Any] = field(default_factory=list)
    asked: list[Any] = field(default_factory=list)
    first_chunk: asyncio.Event = field(default_factory=asyncio.Event)
    #: Forms it fills in (``elicitation/create``), in order: the content to accept, or None to decline. With
    #: ``elicits``, it offers form elicitation in ``initialize``.
    forms: list[dict[str, Any] | None] = field(default_factory=list)
    elicited: list[Any] = field(default_factory=list)
    elicits: bool = False

    async def request_permission(self, session_id: str, tool_call: Any, options: list[PermissionOption],
                                 **kwargs: Any) -> RequestPermissionResponse:
        self.asked.append((tool_call, options))
        answer = self.answers.pop(0) if self.answers else "cancelled"
        if answer == "never":  # a person who walks away: the connection drops with the request unanswered
            await asyncio.Event().wait()
        if answer == "cancelled":
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=answer))

    async def create_elicitation(self, message: str, mode: Any, **kwargs: Any) -> Any:
        self.elicited.append((message, mode))
        content = self.forms.pop(0) if self.forms else None
        if content is None:
            return DeclineElicitationResponse(action="decline")
        return AcceptElicitationResponse(action="accept", content=content)

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)
        if update.session_update == "agent_message_chunk":
            self.first_chunk.set()

    async def until(self, condition: Callable[[], object]) -> None:
        """Wait (in the SDK's loop) until ``condition`` holds; the scenario's ``wait_for`` is the hang guard."""
        while not condition():
            await asyncio.sleep(0.02)

    def text(self) -> str:
        return "".join(u.content.text for u in self.updates if u.session_update == "agent_message_chunk")

    def tool_states(self) -> dict[str, str]:
        """Each tool call's last status."""
        states: dict[str, str] = {}
        for u in self.updates:
            if u.session_update in ("tool_call", "tool_call_update") and u.status:
                states[u.tool_call_id] = u.status
        return states


def acp_command(socket: Path, token: str, log: Path, runtime: str) -> list[str]:
    return [str(TEE), str(log), "--", sys.executable, "-m", "codesdk.supervisor.cli.front", "--url",
            f"unix:{socket}", "--token", token, "acp", "--runtime", runtime]


@asynccontextmanager
async def connect(socket: Path, token: str, log: Path, client: Recorder,
                  runtime: str = "scripted") -> AsyncIterator[Any]:
    """An initialized ACP connection to ``codesdk acp`` through the service on ``socket``, with ``token``."""
    to_client: Any = client  # the SDK's Client protocol lists every method; this client needs two
    command = acp_command(socket, token, log, runtime)
    # elicitation is stable in the schema pinned here (1.21.0), still "unstable" to this SDK (1.19.0)
    async with spawn_agent_process(to_client, sys.executable, *command,
                                   use_unstable_protocol=client.elicits) as (conn, _process):
        offered = ClientCapabilities(elicitation=ElicitationCapabilities(form=ElicitationFormCapabilities())) \
            if client.elicits else None
        answer = await conn.initialize(protocol_version=1, client_capabilities=offered)
        assert answer.protocol_version == 1
        yield conn


def in_thread(scenario: Callable[[], Any]) -> Any:
    """Run an asyncio scenario (the SDK's loop) from the trio test, in a thread of its own."""
    async def run() -> Any:
        return await asyncio.wait_for(scenario(), HANG_GUARD_S)
    return trio.to_thread.run_sync(asyncio.run, run())


