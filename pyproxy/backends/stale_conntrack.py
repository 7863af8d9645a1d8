"""Which conntrack entries go stale when UDP services or endpoints change (pure).

UDP has no connection teardown, so a client keeps hitting the DNAT target conntrack chose
for it until the entry times out, even after that endpoint is gone (upstream issues #19029,
#48370). After a sync, delete: flows to a removed endpoint, flows that were blackholed while
a service had no endpoints, and flows to a service address or NodePort that went away.
An endpoint is its address and port, as upstream's reconciler keys it (``CleanStaleEntries``,
pkg/proxy/conntrack/cleanup.go): a target port that moves on the same pod leaves flows to
the old port behind, which upstream's e2e "cleanup conntrack entries when UDP service target
port changes" expects gone. Filters are narrow (the service's address and port or its
NodePort, and the endpoint's address and port as the reply's source) so unrelated UDP flows,
such as QUIC on the node, survive (upstream #122740).
Shared by every NAT-based backend; the deletions themselves run in ``pyproxy.kernel``.
"""

from __future__ import annotations

from collections.abc import Collection

from pyproxy.model.types import (
    Endpoint,
    IPFamily,
    NamespacedName,
    Protocol,
    ProxyState,
    ServicePort,
    ServicePortName,
)

Filter = tuple[str, ...]


def _usable(eps: tuple[Endpoint, ...]) -> set[tuple[str, int]]:
    return {(str(e.ip), e.port) for e in eps if e.ready or (e.serving and e.terminating)}


def _addresses(sp: ServicePort) -> list[str]:
    return [str(ip) for ip in (*sp.cluster_ips, *sp.external_ips, *sp.load_balancer_ips)]


def _udp_ports(
    state: ProxyState, family: IPFamily, services: Collection[NamespacedName] | None
) -> dict[ServicePortName, ServicePort]:
    ports = (
        state.sorted_services(family)
        if services is None
        else [sp for svc in services for sp in state.ports_of(svc, family)]
    )
    return {sp.name: sp for sp in ports if sp.protocol is Protocol.UDP}


def stale_filters(
    old: ProxyState | None,
    new: ProxyState,
    family: IPFamily,
    services: Collection[NamespacedName] | None = None,
) -> list[Filter]:
    """``conntrack -D`` arguments for entries made stale by going from ``old`` to ``new``,
    looking at ``services`` only (the ones that changed; None: all)."""
    if old is None or (services is not None and not services):
        return []
    out: list[Filter] = []
    seen: set[Filter] = set()

    def add(*args: str) -> None:
        f = ("-p", "udp", *args)
        if f not in seen:
            seen.add(f)
            out.append(f)

    old_svcs = _udp_ports(old, family, services)
    new_svcs = _udp_ports(new, family, services)
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
        for ep_ip, ep_port in sorted(before - after):
            endpoint = ("--reply-src", ep_ip, "--reply-port-src", str(ep_port))
            for addr in _addresses(nsp):
                add("--orig-dst", addr, "--dport", str(nsp.port), *endpoint)
            if nsp.node_port:
                add("--dport", str(nsp.node_port), *endpoint)
    return out
