"""Pure rendering of one service port into upstream kube-proxy v1.36's nftables objects
(pkg/proxy/nftables/proxier.go ``syncProxyRules``, ``writeServiceToEndpointDNATs`` and
``writeServiceToEndpointJumps``): its chains and their rules, its affinity sets, and the
elements it contributes to the shared sets and verdict maps. Each piece has its own function.
Nothing here touches the kernel; node facts come from the state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from pyproxy.backends.nftables import names
from pyproxy.config.settings import ProxyConfig
from pyproxy.model.selection import EndpointSelection, categorize_endpoints
from pyproxy.model.types import (
    Endpoint,
    IPAddress,
    IPFamily,
    IPNetwork,
    NodeInfo,
    ServicePort,
)

TABLE = "kube-proxy"
REJECT_CHAIN = "reject-chain"
CLUSTER_IPS = "cluster-ips"
NODEPORT_IPS = "nodeport-ips"
HAIRPIN = "hairpin-connections"
SERVICE_IPS = "service-ips"
SERVICE_NODEPORTS = "service-nodeports"
NO_ENDPOINT_SERVICES = "no-endpoint-services"
NO_ENDPOINT_NODEPORTS = "no-endpoint-nodeports"
FIREWALL_IPS = "firewall-ips"
LOCALHOST_REJECT_MAP = "localhost-nodeport-reject-ports"
LOCALHOST_PROTOCOLS = ("tcp", "udp", "sctp")
LOCALHOST_REJECTED = ("udp", "sctp")
"""Localhost NodePorts (upstream v1.37, KEP-6032): TCP is served by the user-space relay on
127.0.0.1 / ::1; UDP and SCTP, which it cannot serve, are rejected and counted."""


def localhost_reject_chain(proto: str) -> str:
    return f"localhost-nodeport-reject-{proto}"


def localhost_reject_counter(proto: str) -> str:
    return f"localhost-nodeport-rejected-{proto}"


MAPS = (SERVICE_IPS, SERVICE_NODEPORTS, NO_ENDPOINT_SERVICES, NO_ENDPOINT_NODEPORTS, FIREWALL_IPS)
SETS = (CLUSTER_IPS, HAIRPIN)


@dataclass(frozen=True)
class NftConfig:
    """Render settings for one IP family, fixed at start from the ProxyConfig."""

    family: IPFamily = IPFamily.IPV4
    proxy: ProxyConfig = field(default_factory=ProxyConfig)

    @property
    def nft_family(self) -> str:
        return "ip" if self.family is IPFamily.IPV4 else "ip6"

    @property
    def counters(self) -> bool:
        """A named counter per service port in its DNAT rules (not in upstream's table)."""
        return self.proxy.service_metrics

    @property
    def addr_type(self) -> str:
        return "ipv4_addr" if self.family is IPFamily.IPV4 else "ipv6_addr"

    @property
    def masquerade(self) -> str:
        """Upstream v1.36's inlined marking rule (the mark-for-masquerade chain is gone)."""
        return f"mark set mark or {self.proxy.masquerade.mark}"

    @property
    def no_localhost(self) -> str:
        return "ip daddr != 127.0.0.0/8" if self.family is IPFamily.IPV4 else "ip6 daddr != ::1"

    @property
    def localhost(self) -> str:
        return "ip daddr 127.0.0.0/8" if self.family is IPFamily.IPV4 else "ip6 daddr ::1"

    @property
    def localhost_nodeports(self) -> bool:
        """NodePorts served on loopback too (``--nodeport-addresses`` names it)."""
        return self.proxy.nodeport_addresses.explicit_loopback(self.family)


@dataclass(frozen=True)
class Element:
    """One element of a shared set or verdict map."""

    container: str
    key: str
    value: str = ""
    comment: str = ""

    def text(self) -> str:
        comment = f' comment "{self.comment}"' if self.comment else ""
        value = f" : {self.value}" if self.value else ""
        return f"{{ {self.key}{comment}{value} }}"


@dataclass(frozen=True)
class NodeFacts:
    """What one render needs from the node, derived once per family."""

    node: NodeInfo
    local_cidrs: tuple[IPNetwork, ...]
    node_ip: IPAddress | None


@dataclass
class ServiceObjects:
    """Everything one service (all its ports) contributes to the table."""

    chains: dict[str, list[str]] = field(default_factory=dict)
    """Per-service chains (their names carry a slash) and their rules, in write order."""
    sets: dict[str, str] = field(default_factory=dict)
    """Affinity sets: name -> definition."""
    counters: dict[str, str] = field(default_factory=dict)
    """Named counters (--service-metrics): name -> the service port they count."""
    elements: list[Element] = field(default_factory=list)
    no_local_internal: int = 0
    no_local_external: int = 0

    def merge(self, other: ServiceObjects) -> None:
        self.chains.update(other.chains)
        self.sets.update(other.sets)
        self.counters.update(other.counters)
        self.elements += other.elements
        self.no_local_internal += other.no_local_internal
        self.no_local_external += other.no_local_external


@dataclass(frozen=True)
class _Port:
    """One service port's names, selection and verdicts, decided once (upstream's per-service
    prologue in syncProxyRules)."""

    sp: ServicePort
    sel: EndpointSelection
    cfg: NftConfig
    node: NodeFacts

    @cached_property
    def base(self) -> str:
        return names.port_base(self.sp.name)

    @cached_property
    def proto(self) -> str:
        return self.sp.protocol.value.lower()

    @property
    def counted(self) -> str:
        """The named-counter statement of this port's DNAT rules ("" without counters)."""
        return f'counter name "{names.COUNTER}{self.base}" ' if self.cfg.counters else ""

    @property
    def cluster_chain(self) -> str:
        return names.SERVICE + self.base

    @property
    def local_chain(self) -> str:
        return names.LOCAL + self.base

    @property
    def external_chain(self) -> str:
        return names.EXTERNAL + self.base

    @property
    def firewall_chain(self) -> str:
        return names.FIREWALL + self.base

    @cached_property
    def endpoint_bases(self) -> dict[Endpoint, str]:
        return {ep: names.endpoint_base(self.sp.name, ep) for ep in self.sel.all_reachable}

    @property
    def uses_cluster_chain(self) -> bool:
        return bool(self.sel.cluster) and self.sp.uses_cluster_endpoints

    @property
    def uses_local_chain(self) -> bool:
        return bool(self.sel.local) and self.sp.uses_local_endpoints

    @property
    def has_internal(self) -> bool:
        return self.sel.has_any and (not self.sp.internal_policy_local or bool(self.sel.local))

    @property
    def has_external(self) -> bool:
        return self.sel.has_any and (not self.sp.external_policy_local or bool(self.sel.local))

    @property
    def internal_chain(self) -> str:
        return self.local_chain if self.sp.internal_policy_local else self.cluster_chain

    @property
    def external_policy_chain(self) -> str:
        return self.local_chain if self.sp.external_policy_local else self.cluster_chain

    @property
    def uses_external_chain(self) -> bool:
        return self.sel.has_any and self.sp.externally_accessible

    @property
    def uses_firewall(self) -> bool:
        return bool(self.sp.load_balancer_ips) and bool(self.sp.load_balancer_source_ranges)

    def refusal(self, internal: bool) -> str:
        """The no-endpoint verdict: reject when there is no endpoint anywhere, drop when a
        Local policy has none here."""
        if not self.sel.has_any:
            return f"goto {REJECT_CHAIN}"
        return "drop" if not (self.has_internal if internal else self.has_external) else ""

    def key(self, addr: IPAddress) -> str:
        return f"{addr} . {self.proto} . {self.sp.port}"


def _address_elements(p: _Port, out: ServiceObjects) -> None:
    """cluster-ips, service-ips, no-endpoint-services and firewall-ips elements."""
    sp, name = p.sp, str(p.sp.name)
    cip = sp.cluster_ip(p.cfg.family)
    assert cip is not None  # callers pass family views only
    out.elements.append(Element(CLUSTER_IPS, str(cip)))
    if p.has_internal:
        out.elements.append(Element(SERVICE_IPS, p.key(cip), f"goto {p.internal_chain}"))
    else:
        out.elements.append(Element(NO_ENDPOINT_SERVICES, p.key(cip), p.refusal(True), name))
    external_refusal = p.refusal(False)
    for addr in (*sp.external_ips, *sp.load_balancer_ips):
        if p.sel.has_any:
            out.elements.append(Element(SERVICE_IPS, p.key(addr), f"goto {p.external_chain}"))
        if addr in sp.load_balancer_ips and p.uses_firewall:
            out.elements.append(Element(FIREWALL_IPS, p.key(addr), f"goto {p.firewall_chain}"))
        if external_refusal:
            out.elements.append(Element(NO_ENDPOINT_SERVICES, p.key(addr), external_refusal, name))


def _node_port_elements(p: _Port, out: ServiceObjects) -> None:
    if not p.sp.node_port:
        return
    key = f"{p.proto} . {p.sp.node_port}"
    if p.sel.has_any:
        out.elements.append(Element(SERVICE_NODEPORTS, key, f"goto {p.external_chain}"))
    refusal = p.refusal(False)
    if refusal:
        out.elements.append(Element(NO_ENDPOINT_NODEPORTS, key, refusal, str(p.sp.name)))
    if p.cfg.localhost_nodeports and p.proto in LOCALHOST_REJECTED:
        reject = f"goto {localhost_reject_chain(p.proto)}"
        out.elements.append(Element(LOCALHOST_REJECT_MAP, key, reject))


def _hairpin_elements(p: _Port, out: ServiceObjects) -> None:
    """Local endpoints that may reach themselves through their service: masqueraded."""
    for ep in p.sel.all_reachable:
        if ep.node_name and ep.node_name == p.node.node.name:
            out.elements.append(Element(HAIRPIN, f"{ep.ip} . {ep.ip} . {p.proto} . {ep.port}"))


def _external_chain(p: _Port) -> list[str]:
    """external-*: masquerade (Cluster policy), or short-circuit pod and node traffic (Local
    policy), then on to the policy's chain."""
    rules = []
    if not p.sp.external_policy_local:
        rules.append(f'{p.cfg.masquerade} comment "masquerade"')
    else:
        if p.node.local_cidrs:
            ip = p.cfg.nft_family
            rules.append(
                f"{ip} saddr {p.node.local_cidrs[0]} goto {p.cluster_chain}"
                ' comment "short-circuit pod traffic"'
            )
        rules.append(f'fib saddr type local {p.cfg.masquerade} comment "masquerade local traffic"')
        rules.append(
            f'fib saddr type local goto {p.cluster_chain} comment "short-circuit local traffic"'
        )
    if p.has_external:
        rules.append(f"goto {p.external_policy_chain}")
    return rules


def _firewall_chain(p: _Port) -> list[str]:
    """firewall-*: drop load-balancer traffic from outside the source ranges (the node
    itself may reach its LB IPs when a range holds its IP)."""
    sources = [str(c) for c in p.sp.load_balancer_source_ranges]
    node_ip = p.node.node_ip
    if node_ip is not None and any(node_ip in c for c in p.sp.load_balancer_source_ranges):
        sources += [str(ip) for ip in p.sp.load_balancer_ips]
    return [f"{p.cfg.nft_family} saddr != {{ {', '.join(sources)} }} drop"]


def _dnat_rule(p: _Port, eps: tuple[Endpoint, ...]) -> str:
    """Service chain without affinity: one numgen map straight to the endpoints."""
    ip = p.cfg.nft_family
    elems = " , ".join(f"{i} : {ep.ip} . {ep.port}" for i, ep in enumerate(eps))
    return (
        f"meta l4proto {p.proto} {p.counted}dnat {ip} addr . port to numgen random mod {len(eps)}"
        f" map {{ {elems} }}"
    )


def _affinity_rules(p: _Port, eps: tuple[Endpoint, ...]) -> list[str]:
    """Service chain with ClientIP affinity: a remembered client goes to its endpoint
    chain; others are spread over them."""
    ip = p.cfg.nft_family
    rules = [
        f"{ip} saddr @{names.AFFINITY}{p.endpoint_bases[ep]} goto {names.ENDPOINT}"
        f"{p.endpoint_bases[ep]}"
        for ep in eps
    ]
    verdicts = " , ".join(
        f"{i} : goto {names.ENDPOINT}{p.endpoint_bases[ep]}" for i, ep in enumerate(eps)
    )
    rules.append(f"numgen random mod {len(eps)} vmap {{ {verdicts} }}")
    return rules


def _endpoint_chain(p: _Port, ep: Endpoint) -> list[str]:
    ip = p.cfg.nft_family
    return [
        f"update @{names.AFFINITY}{p.endpoint_bases[ep]} {{ {ip} saddr }}",
        f"meta l4proto {p.proto} {p.counted}dnat to {ep}",
    ]


def _policy_chains(p: _Port, out: ServiceObjects) -> None:
    affinity = p.sp.session_affinity_client_ip
    for used, chain, eps in (
        (p.uses_cluster_chain, p.cluster_chain, p.sel.cluster),
        (p.uses_local_chain, p.local_chain, p.sel.local),
    ):
        if used:
            out.chains[chain] = _affinity_rules(p, eps) if affinity else [_dnat_rule(p, eps)]
            if p.cfg.counters:
                out.counters[names.COUNTER + p.base] = str(p.sp.name)
    if not affinity:
        return
    timeout = f"timeout {p.sp.sticky_max_age_seconds}s"
    for ep in p.sel.all_reachable:
        base = p.endpoint_bases[ep]
        out.chains[names.ENDPOINT + base] = _endpoint_chain(p, ep)
        out.sets[names.AFFINITY + base] = (
            f"{{ type {p.cfg.addr_type} ; flags dynamic,timeout ; {timeout} ; }}"
        )


def render_port(
    sp: ServicePort, eps: tuple[Endpoint, ...], node: NodeFacts, cfg: NftConfig
) -> ServiceObjects:
    """Everything one service port (a family view) contributes to the table."""
    p = _Port(sp, categorize_endpoints(sp, eps, node.node), cfg, node)
    out = ServiceObjects()
    if p.sel.has_any:
        out.no_local_internal = int(not p.has_internal)
        out.no_local_external = int(sp.externally_accessible and not p.has_external)
    for contribute in (_address_elements, _node_port_elements, _hairpin_elements):
        contribute(p, out)
    _policy_chains(p, out)
    if p.uses_external_chain:
        out.chains[p.external_chain] = _external_chain(p)
    if p.uses_firewall:
        out.chains[p.firewall_chain] = _firewall_chain(p)
    return out
