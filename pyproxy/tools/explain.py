"""``pyproxy explain``: why a service's traffic goes where it goes, from the model alone.

For each port of a service: its addresses, its traffic policies, and every endpoint with the
reason it is used or not (not ready, terminating fallback, on another node under a Local
policy, hinted for another zone), answered by the same selection function the backends use,
plus the iptables chains and the nftables objects that carry it. Pure: works on a manifests
directory or a snapshot.
"""

from __future__ import annotations

from pyproxy.backends.iptables import names
from pyproxy.backends.nftables import names as nft
from pyproxy.model.selection import categorize_endpoints
from pyproxy.model.types import Endpoint, NamespacedName, ProxyState, ServicePort


def _why_not(ep: Endpoint, sp: ServicePort, used: set[Endpoint], mode: str, node: str) -> str:
    if ep in used:
        if not ep.ready:
            return "used: terminating but serving, and no endpoint is ready"
        return "used"
    if not ep.ready and not (ep.serving and ep.terminating):
        return "not used: not ready"
    if not ep.ready:
        return "not used: terminating (ready endpoints exist)"
    if mode and mode == "PreferSameZone":
        return "not used: topology hints send this zone's traffic elsewhere"
    if mode:
        return "not used: hinted for another node"
    if sp.internal_policy_local and ep.node_name != node:
        return f"not used: on node {ep.node_name or '?'} and internalTrafficPolicy=Local"
    return "not used"


def explain(state: ProxyState, service: NamespacedName, port: str | None = None) -> str:
    ports = [
        sp
        for sp in state.services.values()
        if sp.name.service == service and (port is None or sp.name.port == port)
    ]
    if not ports:
        return (
            f"{service}: no such service port in the current state (headless, ExternalName, "
            "labelled for another proxy, or unknown)\n"
        )
    out: list[str] = []
    for sp in sorted(ports, key=lambda p: (p.name.port, p.protocol.value)):
        eps = state.endpoints.get(sp.name, ())
        sel = categorize_endpoints(sp, eps, state.node)
        out.append(f"{sp.name} ({sp.protocol.value}) port {sp.port}")
        addrs = [f"cluster IP {ip}" for ip in sp.cluster_ips]
        addrs += [f"NodePort {sp.node_port} on this node's addresses"] if sp.node_port else []
        addrs += [f"external IP {ip}" for ip in sp.external_ips]
        addrs += [f"load-balancer IP {ip}" for ip in sp.load_balancer_ips]
        out.append("  addresses: " + ", ".join(addrs))
        out.append(
            f"  policies: internal={'Local' if sp.internal_policy_local else 'Cluster'} "
            f"external={'Local' if sp.external_policy_local else 'Cluster'}"
            + (
                f" affinity=ClientIP({sp.sticky_max_age_seconds}s)"
                if sp.session_affinity_client_ip
                else ""
            )
            + (f" topology={sel.topology_mode}" if sel.topology_mode else "")
        )
        if not sel.has_any:
            out.append("  no usable endpoint anywhere: connections are refused (REJECT)")
        internal = sel.local if sp.internal_policy_local else sel.cluster
        external = sel.local if sp.external_policy_local else sel.cluster
        out.append(
            f"  internal traffic -> {len(internal)} endpoint(s); external traffic -> "
            f"{len(external)} endpoint(s)"
            + (" (source IP kept)" if sp.external_policy_local else " (masqueraded)")
        )
        used = set(sel.all_reachable)
        for ep in eps:
            where = f"node {ep.node_name}" if ep.node_name else "no node"
            local = " (this node)" if ep.node_name == state.node.name else ""
            out.append(
                f"    {ep}  {where}{local}: "
                f"{_why_not(ep, sp, used, sel.topology_mode, state.node.name)}"
            )
        if not eps:
            out.append("    (no endpoints in any EndpointSlice)")
        out.append(
            f"  iptables chains: {names.cluster_chain(sp.name)} (Cluster), "
            f"{names.local_chain(sp.name)} (Local), {names.external_chain(sp.name)} "
            "(external)"
        )
        base = nft.port_base(sp.name)
        key = f"{sp.protocol.value.lower()} . {sp.port}"
        out.append(
            f"  nftables (table kube-proxy): chains {nft.SERVICE}{base} (Cluster), "
            f"{nft.LOCAL}{base} (Local), {nft.EXTERNAL}{base} (external), "
            f"{nft.FIREWALL}{base} (source ranges); element "
            f"service-ips {{ {' / '.join(map(str, sp.cluster_ips))} . {key} }}"
        )
    return "\n".join(out) + "\n"
