"""Which conntrack entries go stale when UDP services or endpoints change (pure).

UDP has no connection teardown, so a client keeps hitting the DNAT target conntrack chose
for it until the entry times out, even after that endpoint is gone (upstream issues #19029,
#48370). After a sync, delete: flows to a removed endpoint, flows that were blackholed while
a service had no endpoints, and flows to a service address or NodePort that went away.
Filters are narrow (service address + port, or the endpoint as DNAT target) so unrelated UDP
flows, such as QUIC on the node, survive (upstream #122740).
Shared by every NAT-based backend; the deletions themselves run in ``pyproxy.kernel``.
"""

from __future__ import annotations

from pyproxy.model.types import Endpoint, IPFamily, Protocol, ProxyState, ServicePort

Filter = tuple[str, ...]


def _usable(eps: tuple[Endpoint, ...]) -> set[str]:
    return {str(e.ip) for e in eps if e.ready or (e.serving and e.terminating)}


def _addresses(sp: ServicePort) -> list[str]:
    return [str(ip) for ip in (*sp.cluster_ips, *sp.external_ips, *sp.load_balancer_ips)]


def stale_filters(old: ProxyState | None, new: ProxyState, family: IPFamily) -> list[Filter]:
    """``conntrack -D`` arguments for entries made stale by going from ``old`` to ``new``."""
    if old is None:
        return []
    out: list[Filter] = []
    seen: set[Filter] = set()

    def add(*args: str) -> None:
        f = ("-p", "udp", *args)
        if f not in seen:
            seen.add(f)
            out.append(f)

    old_svcs = {s.name: s for s in old.sorted_services(family) if s.protocol is Protocol.UDP}
    new_svcs = {s.name: s for s in new.sorted_services(family) if s.protocol is Protocol.UDP}
    for name, osp in old_svcs.items():
        nsp = new_svcs.get(name)
        new_addrs = set(_addresses(nsp)) if nsp and nsp.port == osp.port else set()
        for addr in _addresses(osp):
            if addr not in new_addrs:
                add("--orig-dst", addr, "--dport", str(osp.port))
        if osp.node_port and (nsp is None or nsp.node_port != osp.node_port):
            add("--dport", str(osp.node_port))

    for name, nsp in new_svcs.items():
        before = _usable(old.endpoints_for(name, family))
        after = _usable(new.endpoints_for(name, family))
        if after and not before:
            # Packets sent while there was no endpoint left unreplied entries behind.
            for addr in _addresses(nsp):
                add("--orig-dst", addr, "--dport", str(nsp.port))
            if nsp.node_port:
                add("--dport", str(nsp.node_port))
        for ep_ip in sorted(before - after):
            for addr in _addresses(nsp):
                add("--orig-dst", addr, "--dst-nat", ep_ip)
            if nsp.node_port:
                add("--dport", str(nsp.node_port), "--dst-nat", ep_ip)
    return out
