"""``pyproxy explain``: why a service's traffic goes where it goes.

For each port of a service: its addresses, its traffic policies, and every endpoint with the
reason it is used or not (not ready, terminating fallback, on another node under a Local
policy, hinted for another zone), answered by the same selection function the backends use;
then, for each of its addresses seen from a pod and from outside the cluster, the mode's own
walk (``pyproxy trace``): the endpoints reached, masquerading, refusals, and the objects that
carry it (chains, map elements, virtual servers). Pure: works on a manifests directory or the
daemon's state.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyproxy.backends.trace import FORWARDED, RELAY, SOCKET, Packet, Trace, objects
from pyproxy.model.selection import categorize_endpoints
from pyproxy.model.types import (
    Endpoint,
    IPAddress,
    IPFamily,
    NamespacedName,
    ProxyState,
    ServicePort,
)

OUTSIDE = {IPFamily.IPV4: ipaddress.ip_address("203.0.113.1"),
           IPFamily.IPV6: ipaddress.ip_address("2001:db8::1")}  # fmt: skip
"""A client outside the cluster (documentation addresses: only the walk sees them)."""


@dataclass(frozen=True)
class Walk:
    """A mode's ``trace``, and a pod address per family to trace from (none: no cluster CIDR
    is known, so no source counts as a pod)."""

    mode: str
    trace: Callable[[Packet], Trace]
    pod_sources: Mapping[IPFamily, IPAddress] = field(default_factory=dict)


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


def _targets(sp: ServicePort, state: ProxyState) -> list[tuple[str, IPAddress, int, bool]]:
    """(what, address, port, from pods too) for each way into the service port. A NodePort
    at the Node's own IP, else at this host's first address that is no service's (IPVS mode
    puts every service address on kube-ipvs0)."""
    out = [("cluster IP", ip, sp.port, True) for ip in sp.cluster_ips]
    if sp.node_port:
        taken = state.service_addresses()
        for family in {IPFamily.of(ip) for ip in sp.cluster_ips}:
            ip = state.node.primary_ip(family) or next(
                (a for a in state.node.local_addresses if IPFamily.of(a) is family
                 and not a.is_loopback and a not in taken), None)  # fmt: skip
            if ip is not None:
                out.append(("NodePort", ip, sp.node_port, False))
    out += [("external IP", ip, sp.port, False) for ip in sp.external_ips]
    out += [("load-balancer IP", ip, sp.port, False) for ip in sp.load_balancer_ips]
    return out


def _paths(sp: ServicePort, state: ProxyState, walk: Walk) -> list[dict[str, Any]]:
    out = []
    for what, ip, port, from_pods in _targets(sp, state):
        family = IPFamily.of(ip)
        sources = [("outside the cluster", OUTSIDE[family])]
        if from_pods and family in walk.pod_sources:
            sources.insert(0, ("a pod", walk.pod_sources[family]))
        for who, src in sources:
            t = walk.trace(Packet(src, ip, port, sp.protocol))
            forwarded = [o for o in t.outcomes if o.verdict in FORWARDED]
            out.append({
                "to": f"{what} {_hostport(ip, port)}", "from": f"{who} ({src})",
                "endpoints": t.endpoints, "verdicts": sorted(t.verdicts),
                "masquerade": any(o.masquerade for o in forwarded) if forwarded else None,
                "objects": _merged([objects(o.steps) for o in t.outcomes]),
            })  # fmt: skip
    return out


def _merged(paths: list[list[str]]) -> list[str]:
    """The objects of every branch, each once, by the earliest place a branch meets it (so
    the endpoint chains come together, before what follows them)."""
    first: dict[str, tuple[int, int]] = {}
    for b, path in enumerate(paths):
        for i, obj in enumerate(path):
            first[obj] = min(first.get(obj, (i, b)), (i, b))
    return sorted(first, key=first.__getitem__)


def _hostport(ip: IPAddress, port: int) -> str:
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def explain_data(
    state: ProxyState, service: NamespacedName, port: str | None = None, walk: Walk | None = None
) -> list[dict[str, Any]]:
    """Per port of the service: its addresses, policies, each endpoint's reason, and (with a
    mode's ``walk``) where each way into it leads (what ``explain -o json`` prints)."""
    out: list[dict[str, Any]] = []
    for sp in _ports(state, service, port):
        eps = state.endpoints.get(sp.name, ())
        sel = categorize_endpoints(sp, eps, state.node)
        addrs = [f"cluster IP {ip}" for ip in sp.cluster_ips]
        addrs += [f"NodePort {sp.node_port} on this node's addresses"] if sp.node_port else []
        addrs += [f"external IP {ip}" for ip in sp.external_ips]
        addrs += [f"load-balancer IP {ip}" for ip in sp.load_balancer_ips]
        internal = sel.internal
        external = sel.external
        used = set(sel.all_reachable)
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
            "paths": _paths(sp, state, walk) if walk else [],
        })  # fmt: skip
    return out


def explain(
    state: ProxyState, service: NamespacedName, port: str | None = None, walk: Walk | None = None
) -> str:
    ports = explain_data(state, service, port, walk)
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
        if walk is not None:
            out.append(f"  paths ({walk.mode} mode; pyproxy trace shows each rule):")
        for path in p["paths"]:
            out.append(f"    {path['to']} from {path['from']}: {_summary(path)}")
            out.append("      via " + ", ".join(path["objects"]) if path["objects"] else
                       "      via none of pyproxy's objects")  # fmt: skip
    return "\n".join(out) + "\n"


def _summary(path: Mapping[str, Any]) -> str:
    eps = path["endpoints"]
    verdicts = [v for v in path["verdicts"] if v not in FORWARDED]
    parts = [", ".join(f"{ep} {p:.0%}" for ep, p in sorted(eps.items()))] if eps else []
    if eps and RELAY in path["verdicts"]:
        parts[0] += "; relayed from the node's address"
    elif eps and SOCKET in path["verdicts"]:
        parts[0] += "; connected at the socket, source IP kept"
    elif eps:
        parts[0] += "; masqueraded" if path["masquerade"] else "; source IP kept"
    names = {"reject": "rejected", "drop": "dropped", "accept": "not handled by pyproxy"}
    parts += [names.get(v, v) for v in verdicts]
    return "; ".join(parts)
