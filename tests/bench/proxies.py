"""One proxy under measurement: upstream kube-proxy or pyproxy, in a node namespace of its
own that reaches the API server through a relay, with its Prometheus metrics read from inside
that namespace and its CPU time and peak memory read from /proc."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.cluster import KUBE_PROXY_TOKEN, PYPROXY_TOKEN, Cluster, binary, kubeconfig
from tests.cluster.nsrelay import Relay, netns
from tests.netns.world import PYPROXY, SocketCgroup, sh

CLUSTER_CIDR = "10.128.0.0/9"
LEGACY = "iptables-legacy"
"""The benchmark's name for iptables mode on the legacy back end: pyproxy is told with
``--iptables-backend=legacy``; upstream runs ``iptables*`` from PATH, so its PATH starts
with a directory of links to the legacy tools."""
TOOLS = ("iptables", "iptables-save", "iptables-restore",
         "ip6tables", "ip6tables-save", "ip6tables-restore")  # fmt: skip
FAMILY = '{ip_family="IPv4"}'


def metrics_in(ns: str) -> str:
    """GET /metrics on 127.0.0.1:10249 inside namespace ``ns``: its body ("" if not up)."""
    with netns(f"/run/netns/{ns}"):
        s = socket.socket()
    try:
        s.settimeout(10)
        s.connect(("127.0.0.1", 10249))
        s.sendall(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    except OSError:
        return ""
    finally:
        s.close()
    return b"".join(chunks).decode(errors="replace").partition("\r\n\r\n")[2]


@dataclass
class Proxy:
    """A proxy process in its own node namespace."""

    name: str  # "kube-proxy" | "pyproxy"
    mode: str
    cluster: Cluster
    workdir: Path
    ns: str = ""
    proc: subprocess.Popen[bytes] | None = None
    relay: Relay | None = None
    sockets: SocketCgroup | None = None
    map_latencies: list[float] = field(default_factory=list)
    """ebpf mode: seen-to-map seconds of the measured changes."""
    map_writes: list[float] = field(default_factory=list)
    """ebpf mode: how long each of those partial socket-map writes took."""
    started: float = 0.0
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.ns = f"ppbench-{self.name}-{self.mode}"
        self.log = self.workdir / f"{self.name}-{self.mode}.log"

    @property
    def proxy_mode(self) -> str:
        return "iptables" if self.mode == LEGACY else self.mode

    def command(self, config: Path) -> list[str]:
        if self.name == "pyproxy":
            legacy = ["--iptables-backend=legacy"] if self.mode == LEGACY else []
            sockets = self.sockets.flags() if self.sockets else []
            return [PYPROXY, f"--mode={self.proxy_mode}", f"--kubeconfig={config}",
                    "--hostname-override=node-a", f"--cluster-cidr={CLUSTER_CIDR}",
                    # The same conntrack flags as upstream's below.
                    "--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0",
                    "--conntrack-tcp-timeout-close-wait=0", *legacy, *sockets]  # fmt: skip
        kube_proxy = binary("kube-proxy")
        assert kube_proxy is not None, "upstream kube-proxy is not built: make e2e"
        return [str(kube_proxy), f"--proxy-mode={self.proxy_mode}", f"--kubeconfig={config}",
                "--hostname-override=node-a", f"--cluster-cidr={CLUSTER_CIDR}",
                "--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0",
                "--conntrack-tcp-timeout-close-wait=0", "--v=1"]  # fmt: skip

    def start(self) -> None:
        sh("ip", "netns", "del", self.ns, check=False)  # left by an interrupted run
        sh("ip", "netns", "add", self.ns)
        sh("ip", "-n", self.ns, "link", "set", "lo", "up")
        if self.mode == "ebpf":  # a child cgroup and a bpffs of the benchmark's own
            self.sockets = SocketCgroup(Path(tempfile.mkdtemp(dir=self.workdir)))
        self.relay = Relay(self.ns, 6443, ("127.0.0.1", self.cluster.api_port))
        token = PYPROXY_TOKEN if self.name == "pyproxy" else KUBE_PROXY_TOKEN
        config = self.workdir / f"{self.name}.kubeconfig"
        config.write_text(kubeconfig("https://127.0.0.1:6443", self.cluster.ca, token))
        env = dict(os.environ)
        if self.mode == LEGACY and self.name == "kube-proxy":
            tools = self.workdir / "legacy-tools"
            tools.mkdir(exist_ok=True)
            for tool in TOOLS:
                link = tools / tool
                if not link.exists():
                    link.symlink_to(f"/usr/sbin/{tool.replace('tables', 'tables-legacy', 1)}")
            env["PATH"] = f"{tools}:{env.get('PATH', '/usr/sbin:/usr/bin')}"
        self.started = time.time()
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, *self.command(config)],
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(20)
        if self.relay is not None:
            self.relay.close()
        if self.sockets is not None:
            self.sockets.close()
            self.sockets = None
        sh("ip", "netns", "del", self.ns, check=False)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # ---- what it reports ------------------------------------------------------------------

    def metrics(self) -> str:
        return metrics_in(self.ns)

    def value(self, text: str, name: str, labels: str = FAMILY) -> float:
        m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    def kernel_services(self) -> int:
        """Service addresses the kernel of the proxy's namespace dispatches (not timed)."""
        if self.mode in ("nftables", "ebpf"):
            res = subprocess.run(
                ["ip", "netns", "exec", self.ns, "nft", "list", "map", "ip", "kube-proxy",
                 "service-ips"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            return res.stdout.count(" : goto service-")
        save = "iptables-legacy-save" if self.mode == LEGACY else "iptables-nft-save"
        res = subprocess.run(
            ["ip", "netns", "exec", self.ns, save, "-t", "nat"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return sum(
            1
            for line in res.stdout.splitlines()
            if line.startswith("-A KUBE-SERVICES ") and ' cluster IP" ' in line
        )

    def cpu_seconds(self, children: bool = False) -> float:
        """User and system CPU (``children``: with the child processes it waited for)."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])
        if children:
            ticks += int(fields[13]) + int(fields[14])
        return ticks / os.sysconf("SC_CLK_TCK")

    def peak_rss_mb(self) -> float:
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        m = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
        return int(m.group(1)) / 1024 if m else 0.0

    def rss_mb(self) -> float:
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        m = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        return int(m.group(1)) / 1024 if m else 0.0
