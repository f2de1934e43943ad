"""Requests the engine makes of a borrowed worker outside any task, and what they answer."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TypeVar

import trio

from codesdk.protocol import ErrorCode, MethodSpec, Model, RuntimeEnv, RuntimeSources
from codesdk.worker.client import RpcError, WorkerError

from ._ending import REQUEST_TIMEOUT_S
from ._errors import RuntimeUnavailable, UnknownRuntime
from ._ports import WorkerLink

P = TypeVar("P", bound=Model)
R = TypeVar("R", bound=Model)


@dataclass(frozen=True)
class WorkerEnvironment:
    """A namespace's running worker as the runtime-env view shows it."""

    env: RuntimeEnv
    pid: int
    uid: int
    gid: int
    cwd: str | None
    workspace: str | None  # where project files were looked for: a session's
    runtimes: tuple[RuntimeSources, ...]

    @classmethod
    def of(cls, worker: WorkerLink, workspace: str | None, runtimes: tuple[RuntimeSources, ...]) -> WorkerEnvironment:
        """``RuntimeUnavailable`` for a worker started without the view (none the pool starts)."""
        spec = worker.spec
        if spec.runtime_env is None:
            raise RuntimeUnavailable(f"{spec.name} was started without a runtime environment to show")
        return cls(env=spec.runtime_env, pid=worker.pid,
                   uid=spec.user if spec.user is not None else os.geteuid(),
                   gid=spec.group if spec.group is not None else os.getegid(), cwd=spec.cwd, workspace=workspace, runtimes=runtimes)


async def ask(worker: WorkerLink, namespace: str, about: str, method: MethodSpec[P, R], params: P) -> R:
    """One request to a borrowed worker, its failures as the engine's refusals: ``UnknownRuntime`` for a runtime
    it does not host, else ``RuntimeUnavailable`` (refused, silent for ``REQUEST_TIMEOUT_S``, or gone)."""
    try:
        with trio.fail_after(REQUEST_TIMEOUT_S):
            return await worker.connection.request(method, params)
    except RpcError as exc:
        refusal = UnknownRuntime if exc.code == ErrorCode.UNKNOWN_RUNTIME else RuntimeUnavailable
        raise refusal(f"{exc.message}" + (f" ({exc.data})" if exc.data else "")) from exc
    except trio.TooSlowError as exc:
        raise RuntimeUnavailable(f"the worker of namespace {namespace!r} did not answer {about} "
                                 f"within {REQUEST_TIMEOUT_S:.0f} s") from exc
    except WorkerError as exc:
        raise RuntimeUnavailable(f"the worker of namespace {namespace!r} went away: {exc}") from exc
