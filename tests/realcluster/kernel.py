"""What a node's kernel holds, read from its network namespace: the facts the real-cluster
tests wait on (the proxies' DaemonSets serve no /debug/state: their metrics address is open)."""

from __future__ import annotations

import re
import subprocess

from tests.cluster import host

# kube-proxy's iptables chains in the nat and filter tables (its cleanup's list) and the
# per-service chains; the kubelet's KUBE-KUBELET-CANARY and KUBE-FIREWALL are not kube-proxy's.
PROXY_CHAIN = re.compile(
    r"^:(KUBE-SERVICES|KUBE-NODEPORTS|KUBE-POSTROUTING|KUBE-PROXY-CANARY|KUBE-FORWARD"
    r"|KUBE-EXTERNAL-SERVICES|KUBE-PROXY-FIREWALL|KUBE-(SVC|SVL|EXT|FW|SEP)-[A-Z0-9]+) "
)


def _in(node: str, *cmd: str) -> str:
    argv = ["nsenter", f"--net=/run/netns/{host.PREFIX}{node}", *cmd]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


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


def serves_in(node: str, mode: str) -> bool:
    """The node holds the objects of ``mode`` and none of the other mode's."""
    chains, tables = proxy_chains(node), nft_tables(node)
    if mode == "nftables":
        return not chains and tables == {"table ip kube-proxy", "table ip6 kube-proxy"}
    return not tables and any(c.endswith(": :KUBE-SERVICES") for c in chains)
