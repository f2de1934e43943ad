"""What goes into a bundle (``BundleSources``), gathered from a running engine: the store to read the session from,
the secrets to redact, and reports on the environment, the configuration, the workers and health.

Apart from the writer so that the writer needs no engine: it archives whatever sources it is given (tests give their
own), and gathering is the only part that knows the engine, the pool and the namespace's variables.
"""

from __future__ import annotations

import contextlib
import json
import platform
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from ..config import ADMIN_TOKEN_FILE
from ..namespaces import NamespaceVariables
from ..store import StoreReader
from ._redact import read_patterns_file

if TYPE_CHECKING:
    from ..engine import Engine


@dataclass
class BundleSources:
    """What a bundle is made of, gathered by the caller (an engine, or tests)."""

    store: StoreReader
    session_id: str
    #: Secret value -> kind: the namespace's stored variable values, tokens this process knows.
    secrets: dict[str, str]
    environment: dict[str, Any]
    config: dict[str, Any]
    workers: dict[str, Any]
    health: dict[str, Any]
    patterns: list[str] = field(default_factory=list)


def codesdk_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("codesdk")
    except PackageNotFoundError:
        return "unknown"


def _fingerprint(env: NamespaceVariables, value: Any) -> str:
    """A keyed hash (the data dir's fingerprint key): equal configurations compare equal; no value can be guessed
    back from it offline."""
    return env.fingerprint(json.dumps(value, sort_keys=True, default=str))


def _options_report(env: NamespaceVariables, options: Any, skip: Iterable[str] = ()) -> dict[str, Any]:
    """Each option of a dataclass: whether it differs from its default, and its fingerprint (never its value)."""
    report: dict[str, Any] = {}
    for f in fields(options):
        if f.name in skip:
            continue
        value = getattr(options, f.name)
        if f.default is not MISSING:
            is_set = value != f.default
        elif f.default_factory is not MISSING:
            is_set = value != f.default_factory()
        else:
            is_set = True  # a required option
        report[f.name] = {"set": is_set, "fingerprint": _fingerprint(env, value)}
    return report


async def sources_from_engine(engine: Engine, session_id: str, *, extra_patterns: Sequence[str] = ()) -> BundleSources:
    """Everything a running engine knows about ``session_id`` and its namespace (no worker is started).

    ``UnknownSession`` if there is no such session."""
    from codesdk.protocol import PROTOCOL_VERSION, mcp_route

    store = engine.store
    session = await store.get_session(session_id)
    namespace = session.namespace
    pool = engine.pool
    data_dir = Path(engine.config.data_dir)
    env = pool.namespace_env
    values: dict[str, str] = await trio.to_thread.run_sync(env.values, namespace)
    secrets = {value: "namespace_env" for value in values.values()}
    for name, value in pool.config.env_for(namespace).items():  # given at start-up: as secret as stored ones,
        if not name.startswith("CODESDK_"):  # but for CodeSDK's own switches (paths, "1"), which are not secrets
            secrets.setdefault(value, "configured_env")
    with contextlib.suppress(OSError):
        token = (await trio.to_thread.run_sync((data_dir / ADMIN_TOKEN_FILE).read_text)).strip()
        if token:
            secrets[token] = "api_token"
    patterns = [*await trio.to_thread.run_sync(read_patterns_file, data_dir), *extra_patterns]

    seen = await store.read_types(session_id, ["session.created", "runtime.request.started"], limit=1000)
    recorded = sorted({json.dumps({"name": e.runtime.name, "model": e.runtime.model}, sort_keys=True)
                       for e in seen})
    worker = pool.worker_of(namespace)
    runtimes: list[Any] = []
    mcp_matrix: list[Any] = []
    if worker is not None and worker.info is not None:
        runtimes = [offer.to_json_obj() for offer in worker.info.runtimes]
        mcp_matrix = [mcp_route(o.name, o.capabilities).model_dump(mode="json") for o in worker.info.runtimes]
    environment = {
        "codesdk_version": codesdk_version(), "protocol_version": PROTOCOL_VERSION,
        "python": sys.version, "implementation": platform.python_implementation(), "platform": platform.platform(),
        "session_runtime": session.runtime, "namespace": namespace,
        "isolation": session.isolation.value,  # where its runtime's HOME was: namespaced, ephemeral or shared
        "runtimes_recorded": [json.loads(r) for r in recorded],
        "worker": ({"pid": worker.pid, "version": worker.info.worker.version if worker.info else None,
                    "runtimes": runtimes} if worker is not None else None),
        "mcp_transports": mcp_matrix,
        "runtimes_note": None if runtimes else "no worker of this namespace is running in this supervisor: runtime "
                                               "versions are those the events record, and capabilities and the MCP "
                                               "transport matrix are unknown (no worker is started for a bundle)",
    }
    def config_report() -> dict[str, Any]:  # reads the fingerprint key: file I/O, in a thread
        return {
            "engine": _options_report(env, engine.config, skip=("pool", "quotas")),
            "pool": _options_report(env, pool.config, skip=("env", "policy")),
            "worker_policy": _options_report(env, pool.config.policy),
            "quotas": _options_report(env, engine.config.quotas),
            "worker_env": {scope: {"names": sorted(vs), "fingerprint": _fingerprint(env, vs)}
                           for scope, vs in pool.config.env.items() if scope in ("*", namespace)},
            "namespace_env": [e.to_json_obj() for e in env.entries(namespace)],
            "redaction_patterns": {"count": len(patterns), "fingerprint": _fingerprint(env, patterns)},
        }

    config = await trio.to_thread.run_sync(config_report)
    status = [s for s in pool.status() if s["namespace"] == namespace]
    workers = {"namespace": namespace, "status": status[0] if status else None,
               "stderr_tail": worker.stderr.text() if worker is not None else None}
    if worker is None:
        workers["note"] = ("no worker of this namespace is running in this supervisor; a crashed worker's stderr "
                           "tail is in its task.failed event")
    tasks = await store.list_tasks(session_id)
    health = {
        "store": {"closed": store.closed, "write_failure": store.write_failure,
                  "write_transactions": store.writer_stats.transactions},
        "worker_template": pool.template_state(),
        "namespace_worker_state": status[0]["state"] if status else "stopped",
        "session": {"last_seq": session.last_seq, "tasks": len(tasks),
                    "task_states": dict(Counter(t.state.value for t in tasks)),
                    "active_task": engine.active_task(session_id)},
    }
    return BundleSources(store=store, session_id=session_id, secrets=secrets, environment=environment,
                         config=config, workers=workers, health=health, patterns=patterns)
