"""A throwaway PostgreSQL server for the tests: ``initdb`` + ``postgres`` on a unix socket in a temp dir.

Nothing listens on TCP by default; ``tcp=TcpListen(...)`` starts the server inside a network namespace a test made,
listening on an address there too (the hosts-apart tests: supervisors in other namespaces reach it over veth). Run as root (CI), the server runs as an unprivileged uid (PostgreSQL refuses root), owning
only its temp dir. ``fsync=off`` keeps it fast: a killed server process loses nothing the kernel already has, which
is what the fault tests do to it (they never crash the machine); ``synchronous_commit`` stays on, so a commit is
acknowledged only once the server wrote it. Each test takes a fresh database (``new_database``).

Where no server binaries are found the tests that need one skip, saying how to get them (``unavailable``).
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.waits import wait_for

#: The uid:gid the server runs as when the tests run as root ("nobody" on Debian; no files of its own anywhere).
SERVER_UID = 65534
USER = "codesdk"


def server_binaries() -> Path | None:
    """The directory with ``initdb`` and ``postgres``: on PATH, else Debian's newest /usr/lib/postgresql/N/bin."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("postgres"):
        return Path(os.path.realpath(on_path)).parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                      key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    for bindir in reversed(versions):
        if (bindir / "initdb").is_file() and (bindir / "postgres").is_file():
            return bindir
    return None


def unavailable() -> str | None:
    """Why no throwaway server can be started here, or None if one can."""
    if importlib.util.find_spec("psycopg") is None:
        return "psycopg is not installed: pip install 'codesdk[postgresql]' (./scripts/bootstrap does)"
    if server_binaries() is None:
        return ("no PostgreSQL server binaries (initdb, postgres) on PATH or in /usr/lib/postgresql/*/bin: "
                "apt-get install postgresql (Debian), or put a PostgreSQL >= 13 bin directory on PATH")
    return None


@dataclass(frozen=True)
class TcpListen:
    """Where a server listens on TCP besides its socket: ``address`` inside the network namespace of process
    ``netns_pid`` (the server is started there, by ``nsenter``: root only), trusting clients from ``clients`` (a
    CIDR; the namespace is the test's own, so nothing else can reach it)."""

    address: str
    clients: str
    netns_pid: int
    port: int = 5432


class PostgresServer:
    """One server; ``start`` it, take databases, ``kill`` and ``start`` it again, ``close`` it at the end."""

    def __init__(self, *, fsync: bool = False, tcp: TcpListen | None = None) -> None:
        """``fsync``: flush to disk as a production server does (benchmarks), rather than leave it to the kernel.
        ``tcp``: also listen there (``tcp_url``); the unix socket stays, for the test's own connections."""
        bindir = server_binaries()
        if bindir is None:
            raise RuntimeError(unavailable())
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="codesdk-pg-"))
        self.socket_dir = self.root  # the socket file: <root>/.s.PGSQL.5432
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._names = itertools.count(1)
        self._as_root = os.geteuid() == 0
        self._fsync = fsync
        self.tcp = tcp
        if tcp is not None and not self._as_root:
            raise RuntimeError("a server listening inside another network namespace needs root (nsenter)")
        if self._as_root:
            os.chown(self.root, SERVER_UID, SERVER_UID)
        self._run([str(bindir / "initdb"), "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8",
                   "--no-locale", "--no-sync"])
        if tcp is not None:  # initdb trusts only 127.0.0.1 and ::1 over TCP
            with open(self.data / "pg_hba.conf", "a") as hba:
                hba.write(f"host all all {tcp.clients} trust\n")

    def _run(self, argv: list[str]) -> None:
        done = subprocess.run(argv, check=False, capture_output=True, user=self._uid, group=self._uid,
                              extra_groups=self._extra_groups)
        if done.returncode:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stderr.decode(errors='replace')}")

    @property
    def _uid(self) -> int | None:
        return SERVER_UID if self._as_root else None

    @property
    def _extra_groups(self) -> list[int] | None:
        return [] if self._as_root else None

    @property
    def admin_url(self) -> str:
        return self.url("postgres")

    def url(self, dbname: str) -> str:
        return f"postgresql://{USER}@/{dbname}?host={self.socket_dir}"

    def tcp_url(self, dbname: str) -> str:
        """The database's URL over TCP (``tcp`` given): for clients in the namespaces wired to the server's."""
        assert self.tcp is not None, "the server listens on its socket only"
        return f"postgresql://{USER}@{self.tcp.address}:{self.tcp.port}/{dbname}"

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        assert self.process is None or self.process.poll() is not None, "already running"
        argv = [str(self.bindir / "postgres"), "-D", str(self.data), "-k", str(self.socket_dir),
                "-c", f"listen_addresses={self.tcp.address if self.tcp else ''}",
                "-c", f"fsync={'on' if self._fsync else 'off'}", "-c", "max_connections=300",
                "-c", "shared_buffers=16MB", "-c", "autovacuum=off"]
        uid, extra_groups = self._uid, self._extra_groups
        if self.tcp is not None:  # nsenter joins the namespace as root, then drops to the server's uid itself
            argv = ["nsenter", f"--net=/proc/{self.tcp.netns_pid}/ns/net", f"--setuid={SERVER_UID}",
                    f"--setgid={SERVER_UID}", "--", *argv, "-p", str(self.tcp.port)]
            uid, extra_groups = None, None
        with open(self.log, "ab") as log:
            # in our session: an engine in this process sweeps children of other sessions away as orphans
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, user=uid,
                                            group=uid, extra_groups=extra_groups)
        wait_for("the throwaway PostgreSQL server to accept connections", self._accepts)

    def _accepts(self) -> bool:
        import psycopg

        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"postgres exited ({self.process.returncode}): {self.log.read_text()[-2000:]}")
        try:
            psycopg.connect(self.admin_url, connect_timeout=2).close()
        except psycopg.OperationalError:
            return False
        return True

    def new_database(self) -> str:
        """A new empty database; its URL."""
        import psycopg

        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def kill(self) -> None:
        """SIGKILL the postmaster, reap it, and wait for its backends to notice and end (a new server can't start
        while they hold the old one's shared memory)."""
        assert self.process is not None
        backends = psutil.Process(self.process.pid).children(recursive=True)
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        wait_for("the killed server's backends to end", lambda: all(_ended(b.pid) for b in backends))

    def close(self) -> None:
        """Stop the server (fast shutdown) and remove everything it had."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def _ended(pid: int) -> bool:
    """Whether the process is gone; reaped here if it became our child (a test process that ran an engine is a
    child subreaper, so the killed server's backends are re-parented to it)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    except ChildProcessError:
        pass
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE and psutil.Process(pid).ppid() != os.getpid()
    except psutil.NoSuchProcess:
        return True
