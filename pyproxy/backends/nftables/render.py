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
from pyproxy.backends.nftables.rule import (
    AnonSet,
    Counter,
    Dnat,
    Fib,
    Match,
    NumgenVmap,
    Rule,
    SetMark,
    SetRef,
    Update,
    Verdict,
)
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
    def masquerade(self) -> SetMark:
        """Upstream v1.36's inlined marking rule (the mark-for-masquerade chain is gone)."""
        return SetMark("or", self.proxy.masquerade.mark)

    @property
    def daddr(self) -> tuple[str]:
        return (f"{self.nft_family} daddr",)

    @property
    def saddr(self) -> tuple[str]:
        return (f"{self.nft_family} saddr",)

    @property
    def loopback(self) -> str:
        return "127.0.0.0/8" if self.family is IPFamily.IPV4 else "::1"

    @property
    def no_localhost(self) -> Match:
        return Match(self.daddr, self.loopback, negated=True)

    @property
    def localhost(self) -> Match:
        return Match(self.daddr, self.loopback)

    @property
    def service_key(self) -> tuple[str, ...]:
        """What the service-ips, firewall-ips and no-endpoint-services maps are keyed on."""
        return (*self.daddr, "meta l4proto", "th dport")

    @property
    def localhost_nodeports(self) -> bool:
        """NodePorts served on loopback too (``--nodeport-addresses`` names it)."""
        return self.proxy.nodeport_addresses.explicit_loopback(self.family)


@dataclass(frozen=True, slots=True)
class Element:
    """One element of a shared set or verdict map: its key's parts (concatenated with ``.``)
    and, in a verdict map, its verdict."""

    container: str
    key: tuple[str, ...]
    value: Verdict | None = None
    comment: str = ""

    def text(self) -> str:
        comment = f' comment "{self.comment}"' if self.comment else ""
        value = f" : {self.value.text}" if self.value else ""
        return f"{{ {' . '.join(self.key)}{comment}{value} }}"


@dataclass(frozen=True)
class NodeFacts:
    """What one render needs from the node, derived once per family."""

    node: NodeInfo
    local_cidrs: tuple[IPNetwork, ...]
    node_ip: IPAddress | None


@dataclass(slots=True)
class ServiceObjects:
    """Everything one service (all its ports) contributes to the table."""

    chains: dict[str, list[Rule]] = field(default_factory=dict)
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

    def refusal(self, internal: bool) -> Verdict | None:
        """The no-endpoint verdict: reject when there is no endpoint anywhere, drop when a
        Local policy has none here."""
        if not self.sel.has_any:
            return Verdict("goto", REJECT_CHAIN)
        return (
            Verdict("drop")
            if not (self.sel.has_internal if internal else self.sel.has_external)
            else None
        )

    def key(self, addr: IPAddress) -> tuple[str, ...]:
        return (str(addr), self.proto, str(self.sp.port))

    def dnat(self, targets: tuple[Endpoint, ...], single: bool = False) -> Rule:
        """``meta l4proto P [counter name ...] dnat ...``: a DNAT rule, counted with
        --service-metrics."""
        counted = (Counter(f"{names.COUNTER}{self.base}"),) if self.cfg.counters else ()
        return Rule((Match(("meta l4proto",), self.proto), *counted,
                     Dnat(self.cfg.nft_family, targets, single)))  # fmt: skip


def _address_elements(p: _Port, out: ServiceObjects) -> None:
    """cluster-ips, service-ips, no-endpoint-services and firewall-ips elements."""
    sp, name = p.sp, str(p.sp.name)
    cip = sp.cluster_ip(p.cfg.family)
    assert cip is not None  # callers pass family views only
    out.elements.append(Element(CLUSTER_IPS, (str(cip),)))
    if p.sel.has_internal:
        out.elements.append(Element(SERVICE_IPS, p.key(cip), Verdict("goto", p.internal_chain)))
    else:
        out.elements.append(Element(NO_ENDPOINT_SERVICES, p.key(cip), p.refusal(True), name))
    external_refusal = p.refusal(False)
    for addr in (*sp.external_ips, *sp.load_balancer_ips):
        if p.sel.has_any:
            out.elements.append(
                Element(SERVICE_IPS, p.key(addr), Verdict("goto", p.external_chain))
            )
        if addr in sp.load_balancer_ips and p.uses_firewall:
            out.elements.append(
                Element(FIREWALL_IPS, p.key(addr), Verdict("goto", p.firewall_chain))
            )
        if external_refusal:
            out.elements.append(Element(NO_ENDPOINT_SERVICES, p.key(addr), external_refusal, name))


def _node_port_elements(p: _Port, out: ServiceObjects) -> None:
    if not p.sp.node_port:
        return
    key = (p.proto, str(p.sp.node_port))
    if p.sel.has_any:
        out.elements.append(Element(SERVICE_NODEPORTS, key, Verdict("goto", p.external_chain)))
    refusal = p.refusal(False)
    if refusal:
        out.elements.append(Element(NO_ENDPOINT_NODEPORTS, key, refusal, str(p.sp.name)))
    if p.cfg.localhost_nodeports and p.proto in LOCALHOST_REJECTED:
        reject = Verdict("goto", localhost_reject_chain(p.proto))
        out.elements.append(Element(LOCALHOST_REJECT_MAP, key, reject))


def _hairpin_elements(p: _Port, out: ServiceObjects) -> None:
    """Local endpoints that may reach themselves through their service: masqueraded."""
    for ep in p.sel.all_reachable:
        if ep.node_name and ep.node_name == p.node.node.name:
            key = (str(ep.ip), str(ep.ip), p.proto, str(ep.port))
            out.elements.append(Element(HAIRPIN, key))


def _external_chain(p: _Port) -> list[Rule]:
    """external-*: masquerade (Cluster policy), or short-circuit pod and node traffic (Local
    policy), then on to the policy's chain."""
    rules = []
    masquerade = p.cfg.masquerade
    if not p.sp.external_policy_local:
        rules.append(Rule((masquerade,), "masquerade"))
    else:
        if p.node.local_cidrs:
            pods = Match(p.cfg.saddr, str(p.node.local_cidrs[0]))
            rules.append(Rule((pods, Verdict("goto", p.cluster_chain)),
                              "short-circuit pod traffic"))  # fmt: skip
        rules.append(Rule((Fib("saddr"), masquerade), "masquerade local traffic"))
        rules.append(Rule((Fib("saddr"), Verdict("goto", p.cluster_chain)),
                          "short-circuit local traffic"))  # fmt: skip
    if p.sel.has_external:
        rules.append(Rule((Verdict("goto", p.external_policy_chain),)))
    return rules


def _firewall_chain(p: _Port) -> list[Rule]:
    """firewall-*: drop load-balancer traffic from outside the source ranges (the node
    itself may reach its LB IPs when a range holds its IP)."""
    sources = [str(c) for c in p.sp.load_balancer_source_ranges]
    node_ip = p.node.node_ip
    if node_ip is not None and any(node_ip in c for c in p.sp.load_balancer_source_ranges):
        sources += [str(ip) for ip in p.sp.load_balancer_ips]
    return [Rule((Match(p.cfg.saddr, AnonSet(tuple(sources)), negated=True), Verdict("drop")))]


def _affinity_rules(p: _Port, eps: tuple[Endpoint, ...]) -> list[Rule]:
    """Service chain with ClientIP affinity: a remembered client goes to its endpoint
    chain; others are spread over them."""
    rules = [
        Rule((Match(p.cfg.saddr, SetRef(names.AFFINITY + p.endpoint_bases[ep])),
              Verdict("goto", names.ENDPOINT + p.endpoint_bases[ep])))
        for ep in eps
    ]  # fmt: skip
    verdicts = tuple(Verdict("goto", names.ENDPOINT + p.endpoint_bases[ep]) for ep in eps)
    return [*rules, Rule((NumgenVmap(verdicts),))]


def _endpoint_chain(p: _Port, ep: Endpoint) -> list[Rule]:
    remember = Update(names.AFFINITY + p.endpoint_bases[ep], p.cfg.saddr[0])
    return [Rule((remember,)), p.dnat((ep,), single=True)]


def _policy_chains(p: _Port, out: ServiceObjects) -> None:
    affinity = p.sp.session_affinity_client_ip
    for used, chain, eps in (
        (p.uses_cluster_chain, p.cluster_chain, p.sel.cluster),
        (p.uses_local_chain, p.local_chain, p.sel.local),
    ):
        if used:
            out.chains[chain] = _affinity_rules(p, eps) if affinity else [p.dnat(eps)]
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
        out.no_local_internal = int(not p.sel.has_internal)
        out.no_local_external = int(sp.externally_accessible and not p.sel.has_external)
    for contribute in (_address_elements, _node_port_elements, _hairpin_elements):
        contribute(p, out)
    _policy_chains(p, out)
    if p.uses_external_chain:
        out.chains[p.external_chain] = _external_chain(p)
    if p.uses_firewall:
        out.chains[p.firewall_chain] = _firewall_chain(p)
    return out
