"""Support bundles: canary secrets put where a real session carries them, and a bundle scanner."""

from __future__ import annotations

import gzip
import io
import json
import secrets
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from codesdk.supervisor.engine import Engine

from tests.api.conftest import api  # noqa: F401  (the API fixture, for the route's tests)
from tests.e2e.conftest import run_task


@dataclass(frozen=True)
class Canaries:
    """Secrets no bundle may hold, each caught by a different rule: a stored variable's value (by value), a key in
    the prompt (``sk-``), a private key block in a file a tool reads, the operator's own pattern, and a bearer
    header the worker writes to its stderr."""

    env: str
    prompt_key: str
    private_key_body: str
    operator: str
    bearer: str

    @classmethod
    def new(cls) -> Canaries:
        return cls(env=f"envcanary-{secrets.token_hex(6)}", prompt_key=f"sk-promptcanary{secrets.token_hex(8)}",
                   private_key_body=f"MIIEtoolcanary{secrets.token_hex(8)}", operator=f"ACME-{secrets.token_hex(8)}",
                   bearer=f"stderrcanary{secrets.token_hex(8)}")

    def all(self) -> list[str]:
        return [self.env, self.prompt_key, self.private_key_body, self.operator, self.bearer]

    @property
    def operator_pattern(self) -> str:
        return r"ACME-[0-9a-f]{16}"

    def file_text(self) -> str:
        return (f"config for the tool\n-----BEGIN PRIVATE KEY-----\n{self.private_key_body}\n-----END PRIVATE KEY-----"
                f"\nlicense {self.operator}\n")

    def stderr_line(self) -> str:
        return f"Authorization: Bearer {self.bearer} and {self.env}"

    def prompt(self) -> str:
        return f"use key {self.prompt_key} and {self.env} please"

    def scenario(self) -> dict[str, Any]:
        return {"name": "canary", "steps": [
            {"text": "You said: {{prompt}}"},
            {"pollute_stdout": self.stderr_line()},  # the worker's stdout goes to its stderr
            {"tool_calls": [{"id": "call_a", "name": "workspace.read", "input": {"path": "secret.txt"}}]},
            {"text": "the file says {{result:call_a.text}}"},
            {"complete": {}},
        ]}


NAMESPACE = "user:canary"


async def canary_session(engine: Engine, canaries: Canaries, workspace: Path, data_dir: Path) -> str:
    """A real task through the engine with every canary in place; returns its session id once the worker's stderr
    holds the canary line."""
    (data_dir / "bundle-redact.txt").write_text(f"# the operator's own\n{canaries.operator_pattern}\n")
    engine.pool.namespace_env.update(NAMESPACE, {"CANARY_VAR": canaries.env})
    workspace.mkdir(exist_ok=True)
    (workspace / "secret.txt").write_text(canaries.file_text())
    session_id, record, events = await run_task(engine, canaries.prompt(), namespace=NAMESPACE, workspace=workspace,
                                                runtime_config={"scenario_inline": canaries.scenario()})
    assert record.state == "completed", record
    assert any(e.type == "tool.call.completed" for e in events)
    worker = engine.pool.worker_of(NAMESPACE)
    assert worker is not None
    while canaries.bearer not in worker.stderr.text():  # its stderr is read as it comes: wait for the line
        await trio.sleep(0.01)
    return session_id


def every_byte(path: Path) -> list[tuple[str, bytes]]:
    """The archive as stored, decompressed, and each member's content: every place a secret could hide."""
    raw = path.read_bytes()
    pieces = [("archive", raw), ("tar", gzip.decompress(raw))]
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
        for member in tar.getmembers():
            pieces.append((f"name:{member.name}", member.name.encode()))
            handle = tar.extractfile(member)
            if handle is not None:
                data = handle.read()
                pieces.append((member.name, data))
                if data[:2] == b"\x1f\x8b":  # a compressed member: its content too
                    pieces.append((f"{member.name} (decompressed)", gzip.decompress(data)))
    return pieces


def leaks(path: Path, needles: list[str]) -> list[str]:
    found = []
    for where, data in every_byte(path):
        for needle in needles:
            if needle.encode() in data or json.dumps(needle).encode()[1:-1] in data:
                found.append(f"{needle} in {where}")
    return found


def members(path: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    with tarfile.open(path, mode="r:gz") as tar:
        for member in tar.getmembers():
            handle = tar.extractfile(member)
            assert handle is not None
            out[member.name] = handle.read()
    return out
