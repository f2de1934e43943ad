"""What the exec sandbox can use on this machine, found out at run time rather than assumed.

Network isolation is a fresh network namespace (``unshare -n`` as root, else ``unshare -r -n`` through an
unprivileged user namespace); the namespace has only a down loopback, so nothing can connect anywhere.
Where it works, a pid namespace is added (``-p -f --kill-child``): when the command ends or is killed, the
kernel kills everything left in it, including daemons that escaped the process group with ``setsid``.
The memory limit is RLIMIT_AS set by ``prlimit`` in the exec chain (no Python code runs between fork and
exec, which would be unsafe in a threaded supervisor).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

import trio

_PROBE_TIMEOUT_S = 10.0
_PROBE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PID_FLAGS = ("-p", "-f", "--kill-child")
#: Tried in order; the first that runs ``true`` wins. Root needs no user namespace.
_VARIANTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("-n", *_PID_FLAGS), "unshare-n+pid"),
    (("-n",), "unshare-n"),
    (("-r", "-n", *_PID_FLAGS), "unshare-rn+pid"),
    (("-r", "-n"), "unshare-rn"),
)


@dataclass(frozen=True)
class SandboxTools:
    """Command prefixes the exec tool can put in front of a command; ``None`` where unavailable."""

    netns_prefix: tuple[str, ...] | None
    netns_label: str | None
    prlimit: str | None


async def _works(argv: list[str]) -> bool:
    with trio.move_on_after(_PROBE_TIMEOUT_S):
        try:
            done = await trio.run_process(
                argv, check=False, stdin=subprocess.DEVNULL, capture_stdout=True, capture_stderr=True, env={}
            )
        except OSError:
            return False
        return done.returncode == 0
    return False


async def probe_sandbox() -> SandboxTools:
    """Try each isolation variant with ``true`` and keep the first that works."""
    unshare = shutil.which("unshare", path=_PROBE_PATH)
    true = shutil.which("true", path=_PROBE_PATH)
    prlimit = shutil.which("prlimit", path=_PROBE_PATH)
    prefix: tuple[str, ...] | None = None
    label: str | None = None
    if unshare and true:
        for flags, name in _VARIANTS:
            candidate = (unshare, *flags, "--")
            if await _works([*candidate, true]):
                prefix, label = candidate, name
                break
    if prlimit and true and not await _works([prlimit, "--as=1073741824", "--", true]):
        prlimit = None
    return SandboxTools(netns_prefix=prefix, netns_label=label, prlimit=prlimit)


class SandboxProber:
    """Probes once, on first use, and remembers (a registry owns one)."""

    def __init__(self) -> None:
        self._found: SandboxTools | None = None
        self._lock = trio.Lock()

    async def get(self) -> SandboxTools:
        async with self._lock:
            if self._found is None:
                self._found = await probe_sandbox()
            return self._found
