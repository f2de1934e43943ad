"""One description per adapter of how to make its runtime behave a given way.

The contract tests say *what* must happen (stream, call tools, be stopped, crash); each case says how its
runtime is made to do it: a scenario for the scripted runtime, prompt directives for the fake model API
that the real agents talk to.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from fixtures.fake_anthropic import opencode_config

#: Written to stderr by the scripted runtime's process before it works, to find it in the crash report.
STDERR_MARKER = "scripted-runtime-process: about to work"


#: The question each runtime is made to ask: one choice of two (the answer the contract gives is "blue").
QUESTION: dict[str, Any] = {"id": "colour", "header": "Colour", "text": "Which colour should it be?",
                            "options": [{"label": "red", "description": "warm"},
                                        {"label": "blue", "description": "calm"}]}


@dataclass
class Turn:
    prompt: str
    runtime_config: dict[str, Any] = field(default_factory=dict)


def _call(tool: str, args: dict[str, Any]) -> str:
    return f"CALL {tool.replace('.', '_')} {json.dumps(args)}"


class ScriptedCase:
    name = "scripted"
    runtime = "scripted"

    def worker_env(self) -> dict[str, str]:
        return {}

    def forget_sessions(self, home: Path, data: Path) -> None:
        """Delete what the runtime keeps of its sessions in the namespace (the scripted runtime keeps nothing)."""

    def stream(self, text: str) -> Turn:
        return Turn(text, {"scenario": "echo"})

    def tools(self, *calls: tuple[str, dict[str, Any]]) -> Turn:
        """Ask for these tool calls at once, then say what came back (results and denial reasons)."""
        ids = [f"c{i}" for i in range(len(calls))]
        summary = " | ".join(f"{i}={{{{result:{i}}}}}{{{{denied:{i}}}}}" for i in ids)
        steps = [{"tool_calls": [{"id": i, "name": name, "input": args} for i, (name, args) in zip(ids, calls)]},
                 {"text": "RESULTS: " + summary}, {"usage": {"input_tokens": 10, "output_tokens": 5}}, {"complete": {}}]
        return Turn("use tools", {"scenario_inline": {"name": "contract-tools", "steps": steps}})

    def slow(self) -> Turn:
        return Turn("count slowly", {"scenario": "slow-stream", "stop_grace_s": 0.5})

    def question(self) -> Turn | None:
        """Ask the user which colour (red or blue), then say what came back."""
        steps = [{"ask": {"questions": [QUESTION]}}, {"text": "ANSWER: {{answer:colour}}"}]
        return Turn("ask me", {"scenario_inline": {"name": "contract-question", "steps": steps}})

    def with_runtime_process(self, ready: Path) -> Turn:
        """Streams a little, then waits on a runtime process of its own (what the test kills); the process says
        it is working (``ready``) once its stderr line is written."""
        program = (f"import sys, time; print({STDERR_MARKER!r}, file=sys.stderr, flush=True); "
                   f"open({str(ready)!r}, 'w').close(); time.sleep(3600)")
        steps = [{"text": "working on it, for a long while", "chunk_size": 4},
                 {"runtime_process": [sys.executable, "-c", program]}, {"complete": {}}]
        return Turn("work", {"scenario_inline": {"name": "runtime-process", "steps": steps}})

    def is_runtime_process(self, process: psutil.Process) -> bool:
        return STDERR_MARKER in " ".join(process.cmdline())

    def runtime_ready(self, ready: Path) -> bool:
        return ready.exists()

    #: What the runtime's process writes to stderr before the crash (found in the report's stderr tail).
    stderr_before_crash: str | None = STDERR_MARKER

    #: Whether the runtime has built-in tools an operator may enable (the built-in contract tests apply).
    builtins: bool = True
    #: The scripted runtime only pretends to run its built-ins: no file appears.
    builtins_touch_files = False

    def builtin_write(self, path: Path, content: str) -> Turn:
        steps = [{"tool_calls": [{"id": "w", "name": "Write", "executed_by": "runtime",
                                  "input": {"file_path": str(path), "content": content}}]},
                 {"text": "RESULTS: w={{result:w}}{{denied:w}}"}, {"complete": {}}]
        return Turn("write with a built-in", {"scenario_inline": {"name": "builtin", "steps": steps}})


class ClaudeCase:
    name = "claude"
    runtime = "claude"

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def worker_env(self) -> dict[str, str]:
        return {"ANTHROPIC_BASE_URL": self.base_url, "ANTHROPIC_API_KEY": "sk-test", "CLAUDE_CODE_MAX_RETRIES": "0"}

    def forget_sessions(self, home: Path, data: Path) -> None:
        shutil.rmtree(home / ".claude" / "projects")

    def stream(self, text: str) -> Turn:
        return Turn(text)

    def tools(self, *calls: tuple[str, dict[str, Any]]) -> Turn:
        return Turn("\n".join(_call(name, args) for name, args in calls))

    def slow(self) -> Turn:
        return Turn("SLOW 20", {"stop_grace_s": 2})

    def question(self) -> Turn | None:
        return Turn(_call("AskUserQuestion", {"questions": [{
            "question": QUESTION["text"], "header": QUESTION["header"], "multiSelect": False,
            "options": QUESTION["options"]}]}))

    def with_runtime_process(self, ready: Path) -> Turn:
        return Turn("SLOW 60")

    def is_runtime_process(self, process: psutil.Process) -> bool:
        return process.name() == "claude"

    def runtime_ready(self, ready: Path) -> bool:
        return True  # streaming: it is working

    #: Claude Code writes nothing to stderr on a quiet run.
    stderr_before_crash: str | None = None

    builtins: bool = True
    builtins_touch_files = True

    def builtin_write(self, path: Path, content: str) -> Turn:
        return Turn(_call("Write", {"file_path": str(path), "content": content}), {"builtin_tools": ["Write"]})


#: A model the fake serves and Codex has no metadata for (with a known one Codex may defer tools behind its tool
#: search); no retries, so an API error ends the turn at once.
CODEX_CONFIG: dict[str, Any] = {"model": "fake-model", "max_retries": 0}


class CodexCase:
    name = "codex"
    runtime = "codex"

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def worker_env(self) -> dict[str, str]:
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": "sk-test"}

    def forget_sessions(self, home: Path, data: Path) -> None:
        shutil.rmtree(home / ".codex" / "sessions")

    def stream(self, text: str) -> Turn:
        return Turn(text, dict(CODEX_CONFIG))

    def tools(self, *calls: tuple[str, dict[str, Any]]) -> Turn:
        return Turn("\n".join(_call(name, args) for name, args in calls), dict(CODEX_CONFIG))

    def slow(self) -> Turn:
        return Turn("SLOW 20", {**CODEX_CONFIG, "stop_grace_s": 2})

    def question(self) -> Turn | None:
        return Turn(_call("request_user_input", {"questions": [{
            "id": QUESTION["id"], "header": QUESTION["header"], "question": QUESTION["text"],
            "options": QUESTION["options"]}]}), dict(CODEX_CONFIG))

    def with_runtime_process(self, ready: Path) -> Turn:
        return Turn("SLOW 60", dict(CODEX_CONFIG))

    def is_runtime_process(self, process: psutil.Process) -> bool:
        return process.name() == "codex"

    def runtime_ready(self, ready: Path) -> bool:
        return True  # streaming: it is working

    #: Codex writes nothing to stderr that the test could plant.
    stderr_before_crash: str | None = None

    #: Codex's built-in tools stay off under CodeSDK: the built-in contract tests do not apply.
    builtins: bool = False
    builtins_touch_files = False

    def builtin_write(self, path: Path, content: str) -> Turn:
        raise NotImplementedError("Codex runs with its built-in tools off")


class _AcpCase:
    """An Agent Client Protocol agent against the fake model: CodeSDK's tools reach it through the MCP bridge; its
    own tools stay hidden, so the built-in contract tests do not apply."""

    name: str
    runtime: str
    config: dict[str, Any]

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def forget_sessions(self, home: Path, data: Path) -> None:
        """Gemini's chats, OpenCode's database, codex-acp's Codex rollouts."""
        chats = list((home / ".gemini" / "tmp").glob("*/chats"))
        databases = list((data / "opencode").glob("opencode.db*"))
        rollouts = [home / ".codex" / "sessions"] if (home / ".codex" / "sessions").is_dir() else []
        assert chats or databases or rollouts, f"no stored session of {self.runtime} under {home} or {data}"
        for path in chats + rollouts:
            shutil.rmtree(path)
        for path in databases:
            path.unlink()

    def stream(self, text: str) -> Turn:
        return Turn(text, dict(self.config))

    def tools(self, *calls: tuple[str, dict[str, Any]]) -> Turn:
        return Turn("\n".join(_call(name, args) for name, args in calls), dict(self.config))

    def question(self) -> Turn | None:
        return None  # declared: the pinned ACP agents have no question that can travel to the user and back

    def slow(self) -> Turn:
        return Turn("SLOW 20", {**self.config, "stop_grace_s": 2})

    def with_runtime_process(self, ready: Path) -> Turn:
        return Turn("SLOW 60", dict(self.config))

    def runtime_ready(self, ready: Path) -> bool:
        return True  # streaming: it is working

    stderr_before_crash: str | None = None
    builtins: bool = False
    builtins_touch_files = False

    def builtin_write(self, path: Path, content: str) -> Turn:
        raise NotImplementedError(f"{self.name} runs with its built-in tools hidden")


#: A model the fake serves; no retries, so an API error ends the turn at once.
GEMINI_CONFIG: dict[str, Any] = {"model": "gemini-2.5-flash", "max_retries": 0}


class GeminiCase(_AcpCase):
    name = "gemini"
    runtime = "gemini"
    config = GEMINI_CONFIG

    def worker_env(self) -> dict[str, str]:
        return {"GOOGLE_GEMINI_BASE_URL": self.base_url, "GEMINI_API_KEY": "test-key"}

    def is_runtime_process(self, process: psutil.Process) -> bool:
        return any(part.endswith("gemini.js") for part in process.cmdline())


#: The model of the fake provider OpenCode is configured with (``opencode_config``).
OPENCODE_CONFIG: dict[str, Any] = {"model": "fake/fake-model"}


class OpenCodeCase(_AcpCase):
    name = "opencode"
    runtime = "opencode"
    config = OPENCODE_CONFIG

    def worker_env(self) -> dict[str, str]:
        return {"OPENCODE_CONFIG_CONTENT": json.dumps(opencode_config(self.base_url))}

    def is_runtime_process(self, process: psutil.Process) -> bool:
        return process.name() == "opencode"


#: A model Codex has metadata for (for one it has none of, Codex's warning comes first as the agent's text); no
#: retries, so an API error ends the turn at once.
CODEX_ACP_CONFIG: dict[str, Any] = {"model": "gpt-5.4-mini", "max_retries": 0}


class CodexAcpCase(_AcpCase):
    name = "codex-acp"
    runtime = "codex-acp"
    config = CODEX_ACP_CONFIG

    def worker_env(self) -> dict[str, str]:
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": "sk-test", "CODESDK_ALLOW_CODEX_ACP": "1"}

    def is_runtime_process(self, process: psutil.Process) -> bool:
        return process.name() == "codex-acp"


Case = ScriptedCase | ClaudeCase | CodexCase | GeminiCase | OpenCodeCase | CodexAcpCase


def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "a.txt").write_text("alpha\n")
    return ws
