"""Assembling an embedded supervisor: store + worker pool + owned tools + engine, from options."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .config import default_data_dir
from .engine import Engine, EngineConfig
from .tools import ExecPolicy, ToolRegistry, ToolsConfig
from .workers.pool import PoolConfig
from .workers.process import become_subreaper


@dataclass(frozen=True)
class SupervisorOptions:
    data_dir: Path = field(default_factory=default_data_dir)
    exec_allowlist: tuple[str, ...] = ()  # non-empty enables the sandboxed workspace.exec tool
    idle_timeout_s: float = 300.0
    max_restarts: int = 5  # crashes within restart_window_s that quarantine a namespace (burst)
    restart_window_s: float = 60.0
    sustained_max_restarts: int = 20  # ... or within sustained_window_s (sustained)
    sustained_window_s: float = 3600.0
    quarantine_s: float = 600.0
    shutdown_grace_s: float = 5.0  # a worker's time to exit after runtime.shutdown before SIGTERM, then SIGKILL
    worker_env: dict[str, dict[str, str]] = field(default_factory=dict)
    worker_argv: tuple[str, ...] = ()
    worker_path: str | None = None


@asynccontextmanager
async def open_engine(options: SupervisorOptions) -> AsyncIterator[Engine]:
    data_dir = Path(options.data_dir)
    become_subreaper()  # orphans of a worker's runtime are adopted and reaped here, not left as zombies
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    pool = PoolConfig(data_dir=data_dir, argv=options.worker_argv, idle_timeout_s=options.idle_timeout_s,
                      max_restarts=options.max_restarts, restart_window_s=options.restart_window_s,
                      sustained_max_restarts=options.sustained_max_restarts,
                      sustained_window_s=options.sustained_window_s, quarantine_s=options.quarantine_s,
                      shutdown_grace_s=options.shutdown_grace_s,
                      env=options.worker_env, path=options.worker_path)
    exec_policy = ExecPolicy(enabled=bool(options.exec_allowlist), allowlist=options.exec_allowlist)
    tools = ToolRegistry(ToolsConfig(exec=exec_policy))
    async with Engine.open(EngineConfig(data_dir=data_dir, pool=pool), tools) as engine:
        yield engine
