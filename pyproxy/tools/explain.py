"""``pyproxy explain``: why a service's traffic goes where it goes, from the model alone.

For each port of a service: its addresses, its traffic policies, and every endpoint with the
reason it is used or not (not ready, terminating fallback, on another node under a Local
policy, hinted for another zone), answered by the same selection function the backends use,
plus the iptables chains and the nftables objects that carry it. Pure: works on a manifests
directory or a snapshot.
"""

from __future__ import annotations

from typing import Any

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


def _ports(state: ProxyState, service: NamespacedName, port: str | None) -> list[ServicePort]:
    found = [
        sp
        for sp in state.services.values()
        if sp.name.service == service and (port is None or sp.name.port == port)
    ]
    return sorted(found, key=lambda p: (p.name.port, p.protocol.value))


def explain_data(
    state: ProxyState, service: NamespacedName, port: str | None = None
) -> list[dict[str, Any]]:
    """Per port of the service: its addresses, policies, each endpoint's reason, and the
    objects each mode programs for it (what ``explain -o json`` prints)."""
    out: list[dict[str, Any]] = []
    for sp in _ports(state, service, port):
        eps = state.endpoints.get(sp.name, ())
        sel = categorize_endpoints(sp, eps, state.node)
        addrs = [f"cluster IP {ip}" for ip in sp.cluster_ips]
        addrs += [f"NodePort {sp.node_port} on this node's addresses"] if sp.node_port else []
        addrs += [f"external IP {ip}" for ip in sp.external_ips]
        addrs += [f"load-balancer IP {ip}" for ip in sp.load_balancer_ips]
        internal = sel.local if sp.internal_policy_local else sel.cluster
        external = sel.local if sp.external_policy_local else sel.cluster
        used = set(sel.all_reachable)
        base = nft.port_base(sp.name)
        key = f"{sp.protocol.value.lower()} . {sp.port}"
        out.append({
            "name": str(sp.name), "protocol": sp.protocol.value, "port": sp.port,
            "addresses": addrs,
            "internalPolicy": "Local" if sp.internal_policy_local else "Cluster",
            "externalPolicy": "Local" if sp.external_policy_local else "Cluster",
            "affinitySeconds": sp.sticky_max_age_seconds if sp.session_affinity_client_ip
            else None,
            "topology": sel.topology_mode or None,
            "usableAnywhere": sel.has_any,
            "internalEndpoints": len(internal), "externalEndpoints": len(external),
            "sourceIPKept": sp.external_policy_local,
            "endpoints": [{
                "endpoint": str(ep), "node": ep.node_name or None,
                "thisNode": ep.node_name == state.node.name,
                "reason": _why_not(ep, sp, used, sel.topology_mode, state.node.name),
            } for ep in eps],
            "iptables": {"cluster": names.cluster_chain(sp.name),
                         "local": names.local_chain(sp.name),
                         "external": names.external_chain(sp.name)},
            "nftables": {"cluster": f"{nft.SERVICE}{base}", "local": f"{nft.LOCAL}{base}",
                         "external": f"{nft.EXTERNAL}{base}", "firewall": f"{nft.FIREWALL}{base}",
                         "element": f"service-ips {{ {' / '.join(map(str, sp.cluster_ips))} . "
                                    f"{key} }}"},
        })  # fmt: skip
    return out


def explain(state: ProxyState, service: NamespacedName, port: str | None = None) -> str:
    ports = explain_data(state, service, port)
    if not ports:
        return (
            f"{service}: no such service port in the current state (headless, ExternalName, "
            "labelled for another proxy, or unknown)\n"
        )
    out: list[str] = []
    for p in ports:
        out.append(f"{p['name']} ({p['protocol']}) port {p['port']}")
        out.append("  addresses: " + ", ".join(p["addresses"]))
        out.append(
            f"  policies: internal={p['internalPolicy']} external={p['externalPolicy']}"
            + (f" affinity=ClientIP({p['affinitySeconds']}s)" if p["affinitySeconds"] else "")
            + (f" topology={p['topology']}" if p["topology"] else "")
        )
        if not p["usableAnywhere"]:
            out.append("  no usable endpoint anywhere: connections are refused (REJECT)")
        out.append(
            f"  internal traffic -> {p['internalEndpoints']} endpoint(s); external traffic -> "
            f"{p['externalEndpoints']} endpoint(s)"
            + (" (source IP kept)" if p["sourceIPKept"] else " (masqueraded)")
        )
        for ep in p["endpoints"]:
            where = f"node {ep['node']}" if ep["node"] else "no node"
            local = " (this node)" if ep["thisNode"] else ""
            out.append(f"    {ep['endpoint']}  {where}{local}: {ep['reason']}")
        if not p["endpoints"]:
            out.append("    (no endpoints in any EndpointSlice)")
        ipt, nf = p["iptables"], p["nftables"]
        out.append(
            f"  iptables chains: {ipt['cluster']} (Cluster), {ipt['local']} (Local), "
            f"{ipt['external']} (external)"
        )
        out.append(
            f"  nftables (table kube-proxy): chains {nf['cluster']} (Cluster), "
            f"{nf['local']} (Local), {nf['external']} (external), {nf['firewall']} (source "
            f"ranges); element {nf['element']}"
        )
    return "\n".join(out) + "\n"
