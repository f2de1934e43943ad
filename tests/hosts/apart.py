"""Hosts that are really apart, on one machine: a database "host" and supervisor "hosts", each a network and mount
namespace of the test's own, wired by veth pairs to a bridge in the database's namespace.

Each namespace is held by a ``sleep`` process (``unshare --net --mount --propagation private``); commands run in it
through ``nsenter -t PID`` (it execs them: the pid the test gets is the command's). A supervisor host mounts a
private tmpfs on one path, the same on every host (as the docs ask), so its data dir is its own: no file is shared
between hosts, only the database over the network. Addresses are in a random 10.x.y.0/24 that exists only inside
these namespaces; nothing is added to the test's own namespace. Ending the holders (by pid, reaped) removes the
namespaces with their links, bridge and tmpfs. The test reaches a supervisor's unix socket and files through
``/proc/PID/root`` (the holder's view of the file system)."""

from __future__ import annotations

import base64
import functools
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit


from tests.postgres import PostgresServer, TcpListen
from tests.service.service_process import ServiceProcess
from tests.waits import wait_for
from tests.worker.harness import REPO

SCENARIOS = str(REPO / "worker" / "adapters" / "scripted" / "scenarios")
#: Short leases, so a takeover comes soon after a death (renewed every third of it).
LEASE_S = 2.0
#: The deployment's secret key, the same on every host (namespace variables are encrypted under it).
SECRET_KEY = base64.b64encode(os.urandom(32)).decode()


@functools.cache
def unavailable() -> str | None:
    """Why namespaces wired by veth cannot be made here, or None if they can (checked by making and ending one)."""
    for tool in ("unshare", "nsenter", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (util-linux / iproute2): the hosts-apart tests make namespaces with it"
    if os.geteuid() != 0:
        return "making network and mount namespaces and veth pairs needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN); CI runs as root"
    probe = subprocess.run(["unshare", "--net", "--mount", "--propagation", "private", "--", "ip", "link", "add",
                            "probe0", "type", "veth", "peer", "name", "probe1"], capture_output=True, check=False)
    if probe.returncode:
        return ("cannot make a network namespace with a veth pair here (unshare --net; ip link add type veth): "
                f"{probe.stderr.decode(errors='replace').strip()}")
    return None


@dataclass
class Namespace:
    """A network + mount namespace held by one ``sleep`` process."""

    name: str
    holder: subprocess.Popen[bytes]

    @classmethod
    def make(cls, name: str) -> Namespace:
        holder = subprocess.Popen(["unshare", "--net", "--mount", "--propagation", "private", "--", "sleep",
                                   "infinity"], stdin=subprocess.DEVNULL)
        namespace = cls(name, holder)
        wait_for(f"host {name}'s namespaces", namespace._made)
        return namespace

    def _made(self) -> bool:
        if self.holder.poll() is not None:
            raise AssertionError(f"unshare for host {self.name} exited {self.holder.returncode}")
        try:
            return os.readlink(f"/proc/{self.pid}/ns/net") != os.readlink("/proc/self/ns/net") and \
                os.readlink(f"/proc/{self.pid}/exe").endswith("sleep")
        except OSError:
            return False

    @property
    def pid(self) -> int:
        return self.holder.pid

    def enter(self, *, mount: bool = True) -> list[str]:
        """The argv prefix that runs a command in this host's namespaces."""
        return ["nsenter", "-t", str(self.pid), "-n", *(["-m"] if mount else []), "--"]

    def run(self, *argv: str) -> None:
        done = subprocess.run([*self.enter(), *argv], capture_output=True, check=False)
        if done.returncode:
            raise RuntimeError(f"{' '.join(argv)} in host {self.name} failed ({done.returncode}): "
                               f"{done.stderr.decode(errors='replace')}")

    def path(self, inside: Path) -> Path:
        """Where the test sees a path of this host's file system."""
        return Path(f"/proc/{self.pid}/root") / inside.relative_to("/")

    def end(self) -> None:
        self.holder.send_signal(signal.SIGKILL)
        self.holder.wait()


@dataclass
class Network:
    """A /24 of its own: the database's namespace holds the bridge (``.1``); host ``n`` gets ``.n+1``."""

    db: Namespace
    prefix: str = field(default_factory=lambda: f"10.{random.randrange(256)}.{random.randrange(256)}")
    hosts: int = 0

    @property
    def db_address(self) -> str:
        return f"{self.prefix}.1"

    @property
    def cidr(self) -> str:
        return f"{self.prefix}.0/24"

    def make_bridge(self) -> None:
        self.db.run("ip", "link", "set", "lo", "up")
        # an address of its own: else the bridge takes its ports' lowest, which changes when a host's link goes,
        # and the other hosts' cached one no longer reaches the database
        self.db.run("ip", "link", "add", "br0", "address", "02:00:00:00:00:01", "type", "bridge")
        self.db.run("ip", "addr", "add", f"{self.db_address}/24", "dev", "br0")
        self.db.run("ip", "link", "set", "br0", "up")

    def wire(self, host: Namespace) -> str:
        """A veth pair from ``host`` (``eth0``) to the bridge; the host's address."""
        self.hosts += 1
        address, port = f"{self.prefix}.{self.hosts + 1}", f"veth{self.hosts}"
        self.db.run("ip", "link", "add", "eth0", "netns", str(host.pid), "type", "veth", "peer", "name", port)
        self.db.run("ip", "link", "set", port, "master", "br0", "up")
        host.run("ip", "link", "set", "lo", "up")
        host.run("ip", "addr", "add", f"{address}/24", "dev", "eth0")
        host.run("ip", "link", "set", "eth0", "up")
        return address


class HostSupervisor(ServiceProcess):
    """``codesdk-supervisor serve`` on one host: its data dir on the host's own tmpfs, the store over TCP."""

    def __init__(self, host: Namespace, address: str, data_dir: Path, store: str, *extra: str,
                 admin_token: str | None = None) -> None:
        """``admin_token``: the deployment's, made by the first supervisor (a row of the shared tokens table) and
        copied to this host's data dir, as the operator does."""
        self.host, self.address, self.data_dir = host, address, data_dir
        self.advertised = f"http://{address}:8443"
        self.what = f"the supervisor on host {host.name}"
        host.path(data_dir).mkdir(mode=0o700)
        self.token_file = host.path(data_dir / "admin.token")
        if admin_token is not None:
            self.token_file.write_text(admin_token + "\n")
        self.socket = host.path(data_dir / "api.sock")
        self.log = Path(tempfile.mkstemp(prefix=f"codesdk-host-{host.name}-", suffix=".log")[1])
        argv = [*host.enter(), sys.executable, "-m", "codesdk.supervisor.cli.admin", "serve", "--data-dir",
                str(data_dir), "--enable-test-scenarios", "--store", store, "--lease-s", str(LEASE_S),
                "--no-worker-template", "--advertise", self.advertised,
                # each host's tmpfs is small; and the hosts share this machine's cgroup tree, where a supervisor's
                # subtree is named by its data dir's path — the same on every host
                "--disk-reserve", "16M", "--no-resource-groups", *extra]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(argv, env={**os.environ, "CODESDK_SCENARIO_DIR": SCENARIOS,
                                                       "CODESDK_SECRET_KEY": SECRET_KEY}, cwd=REPO,
                                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        try:
            self._wait_serving()
        except BaseException:
            self.process.kill()
            self.process.wait()
            self.log.unlink(missing_ok=True)
            raise
        self.token = self.token_file.read_text().strip()

    def stop(self) -> None:
        super().stop()
        self.log.unlink(missing_ok=True)


@dataclass
class Deployment:
    """The database's host and two supervisor hosts, A and B."""

    database: PostgresServer
    #: The store's URL as the hosts reach it (TCP, over their links), and as the test does (the server's socket).
    store: str
    local_store: str
    a: HostSupervisor
    b: HostSupervisor


@contextmanager
def hosts_apart(count: int = 2) -> Iterator[Deployment]:
    """A PostgreSQL host and ``count`` (2) supervisor hosts really apart; everything ended on the way out."""
    with ExitStack() as stack:
        db = Namespace.make("db")
        stack.callback(db.end)
        network = Network(db)
        network.make_bridge()
        database = PostgresServer(tcp=TcpListen(address=network.db_address, clients=network.cidr, netns_pid=db.pid))
        stack.callback(database.close)
        database.start()
        local_store = database.new_database()
        store = database.tcp_url(urlsplit(local_store).path.lstrip("/"))
        # one path for every host's data, each a tmpfs of its own (short: the API socket's path has a limit)
        mount_point = Path(tempfile.mkdtemp(prefix="cs-h-", dir="/tmp"))
        stack.callback(mount_point.rmdir)
        supervisors: list[HostSupervisor] = []
        for letter in "ab"[:count]:
            host = Namespace.make(letter)
            stack.callback(host.end)
            address = network.wire(host)
            host.run("mount", "-t", "tmpfs", "-o", "mode=0755,size=256m", f"codesdk-host-{letter}",
                     str(mount_point))
            supervisor = HostSupervisor(host, address, mount_point / "data", store,
                                        admin_token=supervisors[0].token if supervisors else None)
            stack.callback(supervisor.stop)
            supervisors.append(supervisor)
        yield Deployment(database, store, local_store, *supervisors)
