"""The world a real cluster lives in on this one machine, and its removal.

Everything the cluster changes is inside what this module makes, and ``teardown`` removes all of
it, also after an interrupted run (it finds its objects by name, not only by the state file):

- network namespaces ``pyk-lan`` (a bridge, the control plane, e2e.test) and ``pyk-<node>``
  (each node's "host network"), joined by veths; no address, route or rule in the machine's
  own namespace;
- one private mount namespace, held by a ``sleep`` whose name is ``HOLDER``: every cluster
  process runs in it (entered with ``nsenter --mount --net``, never ``ip netns exec``, which
  remounts /sys and hides the cgroup mounts). In it ``/`` is rshared (the kubelet needs it),
  ``/run``, ``/var/log`` and ``/var/lib`` are the cluster's own (tmpfs: the CNI cache, the
  kubelets' ``/var/log/containers`` links, shim sockets, the xtables lock), so is
  ``/sys/fs/bpf`` (a bpffs of its own: ebpf mode's pins), and the host-wide
  sysctls the kubelet writes are regular files (``MASKED_SYSCTLS``), so its writes never reach the
  machine; ``/etc/resolv.conf`` is empty (no name server outside the namespaces is asked);
- cgroups ``/pyk-<node>`` in every v1 hierarchy (the kubelets' ``cgroupRoot``): pods leave the
  calling shell's cgroup, so teardown kills what is in them itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from tests.cluster.family import Stack

PREFIX = "pyk-"
HOLDER = "pyproxy-real-cluster-holder"
# Host-wide files the kubelet writes at start (pkg/kubelet/cm/container_manager_linux.go
# setupKernelTunables), with the values it writes: in the cluster's mount namespace each is a
# regular file, which starts with the machine's value and takes the kubelet's write.
MASKED_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}
CGROUP_ROOT = Path("/sys/fs/cgroup")
# The v1 hierarchies the kubelet's cgroupfs manager needs its cgroupRoot in (cpu, cpuacct,
# cpuset, memory, pids, systemd) and those runc also writes pods into.
CONTROLLERS = (
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "pids",
    "systemd",
    "blkio",
    "devices",
    "freezer",
)


def log(msg: str) -> None:
    print(f"[cluster {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(*cmd: str, check: bool = True, ns: str | None = None) -> str:
    """Run a command, in network namespace ``ns`` if given (the machine's mount namespace)."""
    argv = [*(["nsenter", f"--net=/run/netns/{ns}"] if ns else []), *cmd]
    res = subprocess.run(argv, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {res.returncode}: {res.stderr.strip()}")
    return res.stdout


def netns_names() -> list[str]:
    out = run("ip", "netns", "list", check=False)
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def make_network(stacks: Sequence[Stack], nodes: list[str]) -> None:
    """``nodes``: names, in the order of the stacks' node addresses and pod CIDRs. The lan
    namespace is the nodes' switch and their router to each other's pod CIDRs; each node routes
    the others' pod CIDRs to them, in each family of ``stacks``. IPv6 addresses are set without
    duplicate address detection (``nodad``): the lan is the cluster's own, and a tentative
    address would refuse the API server's bind for a second or two."""
    lan = PREFIX + "lan"
    run("ip", "netns", "add", lan)
    run("ip", "link", "set", "lo", "up", ns=lan)
    run("ip", "link", "add", "br0", "type", "bridge", ns=lan)
    for s in stacks:
        run("ip", "addr", "add", f"{s.lan_ip}/{s.lan_length}", "dev", "br0", *_nodad(s), ns=lan)
    run("ip", "link", "set", "br0", "up", ns=lan)
    for s in stacks:  # the client outside the nodes' network, towards the LoadBalancer pool
        client = f"{s.client_ip}/{s.host_length}"
        run("ip", "addr", "add", client, "dev", "br0", *_nodad(s), ns=lan)
        run("ip", "route", "add", s.lb_cidr, "dev", "br0", "src", s.client_ip, ns=lan)
    _forward(lan)
    for i, name in enumerate(nodes):
        ns = PREFIX + name
        run("ip", "netns", "add", ns)
        run("ip", "link", "set", "lo", "up", ns=ns)
        # Created in the lan namespace, one end moved: nothing appears in the machine's own.
        run("ip", "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", ns=lan)
        run("ip", "link", "set", "eth0", "netns", f"/run/netns/{ns}", ns=lan)
        run("ip", "link", "set", f"v{i}", "master", "br0", "up", ns=lan)
        for s in stacks:
            addr = f"{s.node_ip(i)}/{s.lan_length}"
            run("ip", "addr", "add", addr, "dev", "eth0", *_nodad(s), ns=ns)
        run("ip", "link", "set", "eth0", "up", ns=ns)
        for s in stacks:
            run("ip", "route", "add", s.default, "via", s.lan_ip, ns=ns)
        _forward(ns)
    for s in stacks:
        for i, name in enumerate(nodes):
            cidr, addr = s.pod_cidrs[i], s.node_ip(i)
            run("ip", "route", "add", cidr, "via", addr, ns=lan)
            for other in nodes:
                if other != name:
                    run("ip", "route", "add", cidr, "via", addr, ns=PREFIX + other)


def _nodad(s: Stack) -> list[str]:
    return ["nodad"] if s.ipv6 else []


def _forward(ns: str) -> None:
    """Forwarding in both families (a namespace's own sysctls, not the machine's)."""
    run("sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1", ns=ns)


def start_holder(state: Path) -> int:
    """The cluster's mount namespace, held by a process that only sleeps."""
    fake = state / "sysctl"
    fake.mkdir(parents=True, exist_ok=True)
    lines = ["set -e", "mount --make-rshared /"]
    lines += [f"mount -t tmpfs -o mode=755 tmpfs {d}" for d in ("/run", "/var/log", "/var/lib")]
    # The cluster's own bpffs (each mount of type bpf is a new, empty one): what pyproxy's ebpf
    # mode pins lives and dies with this namespace, never in the machine's /sys/fs/bpf.
    lines.append("mount -t bpf -o mode=700 bpf /sys/fs/bpf")
    # No name server: nothing in the cluster asks one outside its namespaces.
    (state / "resolv.conf").write_text("")
    lines.append(f"mount --bind {state}/resolv.conf /etc/resolv.conf")
    for path in MASKED_SYSCTLS:
        # The machine's own values to start with: what the kubelet writes shows in the file.
        f = fake / path.replace("/", ".")
        f.write_text(Path(f"/proc/sys/{path}").read_text())
        lines.append(f"mount --bind {f} /proc/sys/{path}")
    lines.append(f"touch {state}/holder.ready")
    lines.append(f"exec -a {HOLDER} sleep infinity")
    p = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", "\n".join(lines)],
        start_new_session=True,
        stdout=(state / "holder.log").open("ab"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 20
    while not (state / "holder.ready").exists():
        if p.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(
                f"mount namespace holder failed: {(state / 'holder.log').read_text()}"
            )
        time.sleep(0.05)
    return p.pid


def masked_values(state: Path) -> dict[str, str]:
    """What the cluster's processes wrote to the masked sysctls (the kubelet's values)."""
    return {p: (state / "sysctl" / p.replace("/", ".")).read_text().strip() for p in MASKED_SYSCTLS}


def spawn(holder: int, ns: str, logfile: Path, *cmd: str, env: dict[str, str] | None = None) -> int:
    """Start a daemon in the cluster's mount namespace and network namespace ``ns``."""
    p = subprocess.Popen(
        ["nsenter", f"--mount=/proc/{holder}/ns/mnt", f"--net=/run/netns/{ns}", *cmd],
        start_new_session=True,
        stdout=logfile.open("ab"),
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    return p.pid


def inside(holder: int, ns: str, *cmd: str, check: bool = True, timeout: float = 120) -> str:
    """Run a command to completion in the cluster's mount namespace and network namespace."""
    argv = ["nsenter", f"--mount=/proc/{holder}/ns/mnt", f"--net=/run/netns/{ns}", *cmd]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {res.returncode}: {res.stderr.strip()[-2000:]}")
    return res.stdout


def make_cgroups(name: str) -> None:
    for c in CONTROLLERS:
        d = CGROUP_ROOT / c / (PREFIX + name)
        d.mkdir(exist_ok=True)
        if c == "cpuset":
            for f in ("cpuset.cpus", "cpuset.mems"):
                (d / f).write_text((CGROUP_ROOT / c / f).read_text())


def machine_facts() -> dict[str, str]:
    """What a cluster must not change on the machine (read only: nothing here writes):
    sysctls, addresses, routes, rules, namespaces and mounts."""
    facts = {f"sysctl {p}": Path(f"/proc/sys/{p}").read_text() for p in MASKED_SYSCTLS}
    for p in (
        "net/ipv4/ip_forward",
        "net/ipv6/conf/all/forwarding",
        "net/netfilter/nf_conntrack_max",
    ):
        f = Path(f"/proc/sys/{p}")
        if f.exists():
            facts[f"sysctl {p}"] = f.read_text()
    for cmd in (["ip", "addr"], ["ip", "route"], ["ip", "-6", "route"], ["nft", "list", "ruleset"]):
        facts[" ".join(cmd)] = subprocess.run(cmd, capture_output=True, text=True).stdout
    for tool in ("iptables-nft-save", "iptables-legacy-save"):
        out = subprocess.run([tool], capture_output=True, text=True).stdout
        facts[tool] = "\n".join(line for line in out.splitlines() if not line.startswith("#"))
    facts["netns"] = " ".join(sorted(netns_names()))
    # The machine's mount table (mount point, type, source): nothing propagated out of the
    # cluster's mount namespace, nothing left mounted. /run/netns is iproute2's own, made by
    # the first `ip netns add` on a machine and kept.
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        if left.split()[4] != "/run/netns":
            mounts.append(f"{left.split()[4]} {' '.join(right.split()[:2])}")
    facts["mounts"] = "\n".join(sorted(mounts))
    return facts


# ---- teardown ----------------------------------------------------------------------------


def _holders() -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if (p / "cmdline").read_bytes().split(b"\0")[0] == HOLDER.encode():
                    out.append(int(p.name))
            except OSError:
                pass
    return out


def _in_mount_ns(ns_inode: int) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            try:
                if os.stat(p / "ns" / "mnt").st_ino == ns_inode:
                    pids.append(int(p.name))
            except OSError:
                pass
    return pids


def _cgroup_dirs() -> list[Path]:
    """Every cgroup under a ``pyk-`` root in every hierarchy, deepest first."""
    found: list[Path] = []
    for h in CGROUP_ROOT.iterdir():
        for top in h.glob(PREFIX + "*"):
            found.extend(Path(d) for d, _, _ in os.walk(top))
    return sorted(found, key=lambda d: len(d.parts), reverse=True)


def _cgroup_pids() -> set[int]:
    pids: set[int] = set()
    for d in _cgroup_dirs():
        try:
            pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        except OSError:
            pass
    return pids


def _kill(pids: set[int] | list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie left by its parent counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def stop_pids(pids: list[int], grace: float = 15) -> None:
    """SIGTERM each process group, then SIGKILL what is left after ``grace`` seconds."""
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def teardown(state: Path, first: list[int]) -> list[str]:
    """Remove everything a cluster made; ``first`` are pids to stop gracefully before the rest
    (kubelets, so they stop restarting pods). Returns what could not be removed."""
    stop_pids(first)
    holders = _holders()
    mnt_inodes = set()
    for h in holders:
        try:
            mnt_inodes.add(os.stat(f"/proc/{h}/ns/mnt").st_ino)
        except OSError:
            pass
    # Pods (in the nodes' cgroups) and every process of the mount namespace: containerd, its
    # shims, the control plane, the holder. Repeat until none is left: a shim may start one more.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pids = _cgroup_pids()
        for ino in mnt_inodes:
            pids.update(_in_mount_ns(ino))
        pids.discard(os.getpid())
        pids = {p for p in pids if _alive(p)}
        if not pids:
            break
        _kill(pids, signal.SIGKILL)
        time.sleep(0.3)
    left: list[str] = []
    for d in _cgroup_dirs():
        for _ in range(50):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
        else:
            left.append(f"cgroup {d}")
    for ns in netns_names():
        run("ip", "netns", "del", ns, check=False)
        if ns in netns_names():
            left.append(f"netns {ns}")
    if state.exists() and not _holders():
        subprocess.run(["rm", "-rf", "--one-file-system", str(state)], check=False)
    return left
