"""What a node's kernel holds, read from its network namespace: the facts the real-cluster
tests wait on (the proxies' DaemonSets serve no /debug/state: their metrics address is open)."""

from __future__ import annotations

import re
import subprocess

from pyproxy.kernel.bpf import AttachType, attached
from tests.cluster import host, real

# kube-proxy's iptables chains in the nat and filter tables (its cleanup's list) and the
# per-service chains; the kubelet's KUBE-KUBELET-CANARY and KUBE-FIREWALL are not kube-proxy's.
PROXY_CHAIN = re.compile(
    r"^:(KUBE-SERVICES|KUBE-NODEPORTS|KUBE-POSTROUTING|KUBE-PROXY-CANARY|KUBE-FORWARD"
    r"|KUBE-EXTERNAL-SERVICES|KUBE-PROXY-FIREWALL|KUBE-(SVC|SVL|EXT|FW|SEP)-[A-Z0-9]+) "
)


def _in(node: str, *cmd: str, check: bool = True) -> str:
    argv = ["nsenter", f"--net=/run/netns/{host.PREFIX}{node}", *cmd]
    return subprocess.run(argv, capture_output=True, text=True, check=check).stdout


def proxy_chains(node: str) -> list[str]:
    """The proxy's iptables chains on ``node`` (IPv4 and IPv6, nf_tables back end)."""
    return [
        f"{tool}: {line.split()[0]}"
        for tool in ("iptables-nft-save", "ip6tables-nft-save")
        for line in _in(node, tool).splitlines()
        if PROXY_CHAIN.match(line)
    ]


def nft_tables(node: str) -> set[str]:
    """The proxy's nftables tables on ``node``: 'table ip kube-proxy', 'table ip6 kube-proxy'."""
    return {t for t in _in(node, "nft", "list", "tables").splitlines() if t.endswith(" kube-proxy")}


def socket_programs(node: str) -> dict[str, int]:
    """How many programs are attached at each socket hook of ``node``'s pods' cgroup (ebpf
    mode attaches one at each, and only there; real.bpf_cgroup)."""
    cgroup = real.bpf_cgroup(node)
    if not cgroup.is_dir():  # runc makes it with the node's first pod
        return {hook.name: 0 for hook in AttachType}
    return {hook.name: len(attached(str(cgroup), hook)) for hook in AttachType}


def serves_in(node: str, mode: str) -> bool:
    """The node holds the objects of ``mode`` and none of another mode's (ebpf mode: nftables
    mode's tables and a program at every socket hook of the node's pods' cgroup)."""
    chains, tables = proxy_chains(node), nft_tables(node)
    programs = set(socket_programs(node).values())
    if mode in ("nftables", "ebpf"):
        both = tables == {"table ip kube-proxy", "table ip6 kube-proxy"}
        return not chains and both and programs == ({1} if mode == "ebpf" else {0})
    return not tables and programs == {0} and any(c.endswith(": :KUBE-SERVICES") for c in chains)


def conntrack(node: str, *match: str) -> list[tuple[str, str]]:
    """The (destination, port) each of ``node``'s conntrack entries matching ``match`` was
    first sent to: the original direction, before any translation."""
    out = []
    for line in _in(node, "conntrack", "-L", *match).splitlines():
        fields: dict[str, str] = {}
        for f in line.split():
            if "=" in f:
                key, value = f.split("=", 1)
                fields.setdefault(key, value)  # the first: the original direction's
        out.append((fields["dst"], fields.get("dport", "")))
    return out


def conntrack_delete(node: str, *match: str) -> None:
    _in(node, "conntrack", "-D", *match, check=False)  # 1: nothing matched
