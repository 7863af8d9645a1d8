"""A small cluster built out of network namespaces, for tests and the demo.

One "node" namespace (where pyproxy runs and programs rules), pod namespaces joined to it by
veth pairs (pod i: 10.244.i.2, its gateway on the node 10.244.i.1), and client namespaces
standing for machines outside the cluster (172.31.0.2, 172.31.0.3, ...) whose default route
is the node. Every address, route and rule lives inside these namespaces; links are created
inside the node namespace, so nothing ever appears in the machine's own namespace.
``close()`` kills what it started and deletes every namespace it made, also after a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PYTHON = sys.executable
PYPROXY = str(Path(sys.executable).with_name("pyproxy"))
CLUSTER_CIDR = "10.244.0.0/16"
NODE_CLIENT_IP = "172.31.0.1"
NODE_CLIENT_IP6 = "fd00:31::1"
CLUSTER_CIDR6 = "fd00:244::/48"


def can_run() -> str | None:
    """None when namespaces can be built here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "iptables-nft", "iptables-legacy", "conntrack"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode:
            return f"{tool} is not installed (run make install as root)"
    return None


def sh(
    *cmd: str, check: bool = True, timeout: float = 60, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, input=input)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {res.stderr.strip()}")
    return res


def in_ns(ns: str, *argv: str, text: str | None = None) -> subprocess.CompletedProcess[str]:
    """``argv`` run in namespace ``ns`` with ``text`` as its input; never raises on failure."""
    return subprocess.run(["ip", "netns", "exec", ns, *argv], input=text, text=True,
                          capture_output=True, timeout=30)  # fmt: skip


@dataclass
class Pod:
    name: str
    index: int

    @property
    def ip(self) -> str:
        return f"10.244.{self.index}.2"

    @property
    def ip6(self) -> str:
        return f"fd00:244:{self.index}::2"


@dataclass
class World:
    tag: str
    pods: list[Pod] = field(default_factory=list)
    clients: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    sockets: SocketCgroup | None = None
    """ebpf mode's cgroup (the proxy fixture's, while it runs in ebpf mode): what a command
    run with ``in_cgroup`` joins first, as a process on the node would be in it."""

    @property
    def node(self) -> str:
        return f"pp{self.tag}-node"

    def client(self, i: int = 0) -> str:
        return self.clients[i]

    def client_ip(self, i: int = 0) -> str:
        return f"172.31.0.{i + 2}"

    def client_ip6(self, i: int = 0) -> str:
        return f"fd00:31::{i + 2}"

    def ns_of(self, pod: Pod) -> str:
        return f"pp{self.tag}-{pod.name}"

    # ---- building ---------------------------------------------------------------------

    def _add_ns(self, name: str) -> None:
        sh("ip", "netns", "add", name)
        self.namespaces.append(name)
        sh("ip", "-n", name, "link", "set", "lo", "up")

    def build(self, pod_count: int = 3, client_count: int = 2) -> World:
        try:
            self._add_ns(self.node)
            self.exec(self.node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            self.exec(self.node, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
            # Tests count ICMP rejects one by one; the kernel's per-host rate limit would
            # swallow some of a quick burst.
            self.exec(self.node, "sysctl", "-qw", "net.ipv4.icmp_ratelimit=0")
            sh("ip", "-n", self.node, "link", "add", "cbr", "type", "bridge")
            sh("ip", "-n", self.node, "addr", "add", f"{NODE_CLIENT_IP}/24", "dev", "cbr")
            sh("ip", "-n", self.node, "addr", "add", f"{NODE_CLIENT_IP6}/64", "dev", "cbr", "nodad")
            sh("ip", "-n", self.node, "link", "set", "cbr", "up")
            # Like a real node, route everything somewhere: an absent host on the client
            # bridge, inside this world (so a dropped packet is silent, as on a real node).
            sh("ip", "-n", self.node, "route", "add", "default", "via", "172.31.0.254")
            sh("ip", "-n", self.node, "-6", "route", "add", "default", "via", "fd00:31::fe")
            for i in range(client_count):
                self.add_client(i)
            for i in range(1, pod_count + 1):
                self.add_pod(f"pod-{i}", i)
        except BaseException:
            self.close()
            raise
        return self

    def veth(
        self,
        host_ns: str,
        link: str,
        peer_ns: str,
        peer_addrs: Sequence[str] = (),
        host_addrs: Sequence[str] = (),
        master: str | None = None,
        gateways: Sequence[str] = (),
    ) -> None:
        """A veth pair made inside ``host_ns`` (never in the machine's namespace), its peer
        ``eth0`` in ``peer_ns``; addresses on both ends, default routes in the peer."""

        def nodad(addr: str) -> list[str]:
            return ["nodad"] if ":" in addr else []

        sh(
            "ip",
            "-n",
            host_ns,
            "link",
            "add",
            link,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            peer_ns,
        )
        for addr in host_addrs:
            sh("ip", "-n", host_ns, "addr", "add", addr, "dev", link, *nodad(addr))
        sh("ip", "-n", host_ns, "link", "set", link, *(["master", master] if master else []), "up")
        for addr in peer_addrs:
            sh("ip", "-n", peer_ns, "addr", "add", addr, "dev", "eth0", *nodad(addr))
        sh("ip", "-n", peer_ns, "link", "set", "eth0", "up")
        for gw in gateways:
            sh(
                "ip",
                "-n",
                peer_ns,
                *(["-6"] if ":" in gw else []),
                "route",
                "add",
                "default",
                "via",
                gw,
            )

    def add_client(self, i: int) -> str:
        name = f"pp{self.tag}-client{i}"
        self._add_ns(name)
        self.veth(
            self.node,
            f"c{i}",
            name,
            [f"{self.client_ip(i)}/24", f"fd00:31::{i + 2}/64"],
            master="cbr",
            gateways=[NODE_CLIENT_IP, NODE_CLIENT_IP6],
        )
        self.clients.append(name)
        return name

    def add_pod(self, name: str, index: int, echo: bool = True) -> Pod:
        pod = Pod(name, index)
        ns = self.ns_of(pod)
        self._add_ns(ns)
        self.veth(
            self.node,
            f"p{index}",
            ns,
            [f"{pod.ip}/24", f"{pod.ip6}/64"],
            host_addrs=[f"10.244.{index}.1/24", f"fd00:244:{index}::1/64"],
            gateways=[f"10.244.{index}.1", f"fd00:244:{index}::1"],
        )
        self.pods.append(pod)
        if echo:
            self.start_echo(pod)
        return pod

    def start_echo(self, pod: Pod, *args: str) -> subprocess.Popen[str]:
        """The pod's echo server; ``args`` for a second one (another name and ports)."""
        cmd = args or ("--name", pod.name)
        p = self.spawn(self.ns_of(pod), PYTHON, str(HERE / "echo.py"), *cmd)
        assert p.stdout is not None
        line = p.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"echo server in {pod.name} did not start")
        return p

    # ---- running ----------------------------------------------------------------------

    def exec(
        self, ns: str, *cmd: str, check: bool = True, timeout: float = 60, input: str | None = None,
        in_cgroup: bool = False,
    ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        join: list[str] = []
        if in_cgroup:
            assert self.sockets is not None, "no socket cgroup: the proxy is not in ebpf mode"
            join = self.sockets.join()
        return sh(*join, "ip", "netns", "exec", ns, *cmd, check=check, timeout=timeout,
                  input=input)  # fmt: skip

    def spawn(
        self,
        ns: str,
        *cmd: str,
        stdout: Any = subprocess.PIPE,
        stderr: Any = subprocess.DEVNULL,
        stdin: Any = None,
        prefix: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[str]:
        """Run ``cmd`` in ``ns``; ``prefix`` wraps the ``ip netns exec`` (a private mount
        namespace, say) and ``env`` replaces the environment."""
        p = subprocess.Popen(
            [*prefix, "ip", "netns", "exec", ns, *cmd],
            stdout=stdout,
            stderr=stderr,
            stdin=stdin,
            text=True,
            start_new_session=True,
            env=env,
        )
        self.procs.append(p)
        return p

    def probe(
        self,
        proto: str,
        host: str,
        port: int,
        count: int = 1,
        client: int = 0,
        timeout: float = 2.0,
        sport: int = 0,
        ns: str | None = None,
        in_cgroup: bool = False,
    ) -> dict[str, Any]:
        args = [
            PYTHON,
            str(HERE / "probe.py"),
            proto,
            host,
            str(port),
            "--count",
            str(count),
            "--timeout",
            str(timeout),
        ]
        if sport:
            args += ["--sport", str(sport)]
        res = self.exec(ns or self.client(client), *args, timeout=count * timeout + 30,
                        in_cgroup=in_cgroup)  # fmt: skip
        out: dict[str, Any] = json.loads(res.stdout)
        return out

    def iptables_save(self, table: str = "nat", backend: str = "nft") -> str:
        return self.exec(self.node, f"iptables-{backend}-save", "-t", table).stdout

    def stop(self, p: subprocess.Popen[str], sig: int = signal.SIGTERM, wait: float = 10) -> None:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)
            try:
                p.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=wait)

    def close(self) -> None:
        for p in reversed(self.procs):
            self.stop(p, wait=5)
        self.procs.clear()
        for ns in reversed(self.namespaces):
            sh("ip", "netns", "del", ns, check=False)
        self.namespaces.clear()


class SocketCgroup:
    """What ebpf mode attaches to in a test: a child cgroup of the test's own (never a
    cgroup2 mount's root, which is the machine's root cgroup) and a bpffs for its pins, both
    mounted in a temporary directory (``ip netns exec`` gives its command a /sys of its own,
    without the machine's cgroup mounts). ``close`` (also after a failure) ends what is left
    in the cgroup, removes it and unmounts both."""

    def __init__(self, tmp: Path) -> None:
        self.cgroup2 = tmp / "cgroup2"
        self.bpffs = tmp / "bpffs"
        self.path = self.cgroup2 / f"pyproxy-test-{os.getpid()}-{tmp.name}"
        self.cgroup2.mkdir()
        self.bpffs.mkdir()
        sh("mount", "-t", "cgroup2", "none", str(self.cgroup2))
        try:
            self.path.mkdir()
            sh("mount", "-t", "bpf", "bpf", str(self.bpffs))
        except BaseException:
            self.path.rmdir() if self.path.exists() else None
            sh("umount", str(self.cgroup2), check=False)
            raise

    @property
    def pin_dir(self) -> Path:
        return self.bpffs / "pyproxy"

    def flags(self) -> list[str]:
        return ["--bpf-cgroup", str(self.path), "--bpf-pin-dir", str(self.pin_dir)]

    def join(self) -> list[str]:
        """A prefix that moves the command's process into the cgroup before it runs."""
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh"]

    def close(self) -> None:
        for pid in (self.path / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        wait_for(lambda: not (self.path / "cgroup.procs").read_text().split() or None,
                 timeout=10, what="the test cgroup to empty")  # fmt: skip
        sh("umount", str(self.bpffs), check=False)
        self.path.rmdir()
        sh("umount", str(self.cgroup2), check=False)


class Pyproxy:
    """pyproxy running in a node namespace, on a manifests directory or (with ``kubeconfig``
    and ``manifests=None``) against an API server."""

    def __init__(
        self,
        world: World,
        manifests: Path | None,
        log: Path,
        *extra: str,
        mode: str = "iptables",
        kubeconfig: Path | None = None,
        node: str = "node-a",
        ns: str | None = None,
    ) -> None:
        self.world = world
        self.mode = mode
        self.manifests = manifests or Path("/nonexistent")
        self.log = log
        self.ns = ns or world.node
        source = ["--manifests", str(manifests)] if manifests else ["--kubeconfig", str(kubeconfig)]
        self.args = [
            "--mode",
            mode,
            *source,
            "--hostname-override",
            node,
            "--cluster-cidr",
            f"{CLUSTER_CIDR},{CLUSTER_CIDR6}",
            "--min-sync-period",
            "0.1s",
            # Only the machine's first namespace may size the conntrack table: a node in a
            # namespace of its own leaves it, as kind's kube-proxy does (the timeouts are the
            # namespace's own and are set).
            "--conntrack-max-per-core=0",
            # In the node's namespace only: /debug/state is what the tests wait on.
            "--metrics-bind-address",
            f"127.0.0.1:{METRICS_PORT}",
            "--healthz-bind-address",
            "",
            # A start removes what ebpf mode pinned (Mode.outlives): never look in the
            # machine's /sys/fs/bpf (an ebpf test's own flags, later, win).
            "--bpf-pin-dir",
            str(log.parent / "no-pins"),
            *extra,
        ]
        self.proc: subprocess.Popen[str] | None = None
        self.prefix: Sequence[str] = ()
        self.env: dict[str, str] | None = None

    def start(self) -> Pyproxy:
        self.proc = self.world.spawn(
            self.ns,
            PYPROXY,
            *self.args,
            stdout=self.log.open("a"),
            stderr=subprocess.STDOUT,
            prefix=self.prefix,
            env=self.env,
        )
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.world.stop(self.proc)
            self.proc = None

    def state(self) -> dict[str, Any]:
        """pyproxy's /debug/state ({} while it does not answer)."""
        res = self.world.exec(self.ns, PYTHON, "-I", "-S", "-c", GET_JSON, str(METRICS_PORT),
                              "/debug/state", check=False)  # fmt: skip
        try:
            doc: dict[str, Any] = json.loads(res.stdout)
        except ValueError:
            return {}
        return doc

    def counts(self) -> SyncCounts:
        return SyncCounts.of(self.state())

    def syncs(self) -> int:
        return self.counts().syncs

    def wait_programmed(self, before: SyncCounts, timeout: float = 15.0,
                        what: str = "the change to be programmed") -> SyncCounts:  # fmt: skip
        """Until pyproxy has seen a change after ``before`` and programmed everything it has
        seen (its generations, not its log)."""

        def done() -> SyncCounts | None:
            now = self.counts()
            seen = now.observed > before.observed
            return now if seen and now.programmed >= now.observed else None

        result: SyncCounts = wait_for(done, timeout=timeout, what=what)
        return result

    def wait_syncs(self, more_than: SyncCounts, full: bool = False, timeout: float = 15.0,
                   what: str = "a sync") -> SyncCounts:  # fmt: skip
        """Until a sync (``full``: a full one) has succeeded after ``more_than`` was read."""

        def done() -> SyncCounts | None:
            now = self.counts()
            if full:
                return now if now.full > more_than.full else None
            return now if now.ok > more_than.ok else None

        result: SyncCounts = wait_for(done, timeout=timeout, what=what)
        return result

    def write(self, name: str, *docs: dict[str, Any]) -> None:
        import yaml

        path = self.manifests / f"{name}.yaml"
        tmp = self.manifests / f".{name}.tmp"
        tmp.write_text(yaml.safe_dump_all(docs))
        tmp.replace(path)

    def remove(self, name: str) -> None:
        (self.manifests / f"{name}.yaml").unlink(missing_ok=True)


METRICS_PORT = 10249
GET_JSON = r"""
import socket, sys
try:
    with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5) as s:
        s.sendall(b"GET " + sys.argv[2].encode() + b" HTTP/1.0\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    print(body.decode() if head.split()[1:2] == [b"200"] else "{}")
except (OSError, IndexError):
    print("{}")
"""
"""A GET with nothing but a socket, run with ``python -I -S``: polled many times a test, and
inside user-mode Linux a Python that imports urllib and site takes a good part of a second."""


@dataclass(frozen=True)
class SyncCounts:
    """What pyproxy's /debug/state says about its syncs (zeros before it answers)."""

    syncs: int = 0
    full: int = 0
    failed: int = 0
    observed: int = 0
    programmed: int = 0
    last_full_reason: str = ""
    """Why the last full sync was full."""

    @property
    def ok(self) -> int:
        return self.syncs - self.failed

    @classmethod
    def of(cls, state: dict[str, Any]) -> SyncCounts:
        gen = state.get("generation") or {}
        full = state.get("lastFullSync") or {}
        return cls(state.get("syncs", 0), state.get("fullSyncs", 0), state.get("failedSyncs", 0),
                   gen.get("observed", 0), gen.get("programmed", 0),
                   full.get("reason") or "")  # fmt: skip


HOLD = r"""
import socket, struct, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
f = s.makefile("rw")
print(f.readline().strip(), flush=True)
for line in sys.stdin:
    f.write(line); f.flush()
    print(f.readline().strip(), flush=True)
s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
s.close()  # with a reset, so the server side (and IPVS) forget it at once
"""


class Held:
    """An open TCP connection from a namespace: ``pod`` answered its greeting, ``say`` sends
    a line on the same connection and returns the reply's words."""

    def __init__(self, world: World, ns: str, host: str, port: int) -> None:
        self.world = world
        self.proc = world.spawn(ns, PYTHON, "-c", HOLD, host, str(port), stdin=subprocess.PIPE)
        assert self.proc.stdout is not None
        self.pod = self.proc.stdout.readline().split()[0]

    def say(self, text: str) -> list[str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().split()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def wait_for(
    pred: Callable[[], Any], timeout: float = 15.0, interval: float = 0.1, what: str = "condition"
) -> Any:
    """Poll ``pred`` until it returns something truthy; bounded by ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def names_in(result: dict[str, Any]) -> set[str]:
    return set(result["replies"])


def total(result: dict[str, Any]) -> int:
    return int(sum(result["replies"].values()))


def manifest_objects(
    world: World,
    svc: dict[str, Any],
    pods: Sequence[Pod],
    ports: Sequence[dict[str, Any]],
    node_of: Callable[[Pod], str] | None = None,
    slice_name: str | None = None,
    ipv6: bool = False,
) -> list[dict[str, Any]]:
    """A Service plus an EndpointSlice naming ``pods`` (all on node-a unless ``node_of``);
    with ``ipv6`` a second, IPv6 slice as the EndpointSlice controller writes for dual-stack."""
    meta = svc["metadata"]
    out = [svc]
    for family in ("IPv4", "IPv6") if ipv6 else ("IPv4",):
        eps = [
            {
                "addresses": [p.ip if family == "IPv4" else p.ip6],
                "conditions": {"ready": True},
                "nodeName": node_of(p) if node_of else "node-a",
            }
            for p in pods
        ]
        name = slice_name or f"{meta['name']}-{family.lower()}"
        out.append(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": name,
                    "namespace": meta["namespace"],
                    "labels": {"kubernetes.io/service-name": meta["name"]},
                },
                "addressType": family,
                "ports": list(ports),
                "endpoints": eps,
            }
        )
    return out
