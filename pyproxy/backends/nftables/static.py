"""The part of the kube-proxy table that depends on no service (upstream's ``setupNFTables``):
base chains with their hooks, the dispatch and check chains, the shared sets and verdict maps
and their fixed rules. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from pyproxy.backends.nftables.render import (
    CLUSTER_IPS,
    FIREWALL_IPS,
    HAIRPIN,
    LOCALHOST_REJECT_MAP,
    LOCALHOST_REJECTED,
    NO_ENDPOINT_NODEPORTS,
    NO_ENDPOINT_SERVICES,
    NODEPORT_IPS,
    REJECT_CHAIN,
    SERVICE_IPS,
    SERVICE_NODEPORTS,
    Element,
    NftConfig,
    NodeFacts,
    localhost_reject_chain,
    localhost_reject_counter,
)
from pyproxy.backends.nftables.rule import (
    AnonSet,
    Counter,
    Ct,
    Expr,
    Fib,
    MarkTest,
    Masquerade,
    Match,
    Rule,
    SetMark,
    SetRef,
    Verdict,
    Vmap,
)
from pyproxy.model.types import IPFamily, IPNetwork

TABLE_COMMENT = "rules for kube-proxy"
PORT_KEY = ("meta l4proto", "th dport")
"""What the NodePort maps are keyed on."""

# (name, type, hook, priority): upstream's nftablesBaseChains
BASE_CHAINS = (
    ("filter-prerouting-pre-dnat", "filter", "prerouting", "-110"),
    ("filter-output-pre-dnat", "filter", "output", "-110"),
    ("filter-input", "filter", "input", "0"),
    ("filter-forward", "filter", "forward", "0"),
    ("filter-output", "filter", "output", "0"),
    ("nat-prerouting", "nat", "prerouting", "-100"),
    ("nat-output", "nat", "output", "-100"),
    ("nat-postrouting", "nat", "postrouting", "100"),
)
# (target, from, only new connections): upstream's nftablesJumpChains
JUMPS = (
    ("nodeport-endpoints-check", "filter-input", True),
    ("service-endpoints-check", "filter-input", True),
    ("service-endpoints-check", "filter-forward", True),
    ("service-endpoints-check", "filter-output", True),
    ("firewall-check", "filter-prerouting-pre-dnat", True),
    ("firewall-check", "filter-output-pre-dnat", True),
    ("services", "nat-output", False),
    ("services", "nat-prerouting", False),
    ("masquerading", "nat-postrouting", False),
    ("cluster-ips-check", "filter-forward", True),
    ("cluster-ips-check", "filter-output", True),
)
NEW = Ct("state", "new")


@dataclass
class Static:
    """Objects and rules of the table that no service owns."""

    chains: dict[str, str] = field(default_factory=dict)
    """Every non-service chain -> its definition ("" for a plain chain)."""
    rules: dict[str, list[Rule]] = field(default_factory=dict)
    sets: dict[str, str] = field(default_factory=dict)
    maps: dict[str, str] = field(default_factory=dict)
    elements: list[Element] = field(default_factory=list)
    counters: list[str] = field(default_factory=list)
    match_all_nodeports: bool = False
    """NodePorts on every local address: the nodeport-ips set must not exist."""


def _rule(s: Static, chain: str, *exprs: Expr, comment: str = "") -> None:
    s.rules.setdefault(chain, []).append(Rule(exprs, comment))


def _containers(s: Static, cfg: NftConfig) -> None:
    a = cfg.addr_type
    key = f"{a} . inet_proto . inet_service : verdict"
    port_key = "inet_proto . inet_service : verdict"
    sets = {
        CLUSTER_IPS: (a, "Active ClusterIPs"),
        HAIRPIN: (f"{a} . {a} . inet_proto . inet_service", "service hairpin connections"),
    }
    if not s.match_all_nodeports:
        sets[NODEPORT_IPS] = (a, "IPs that accept NodePort traffic")
    maps = {
        NO_ENDPOINT_SERVICES: (
            key, "vmap to drop or reject packets to services with no endpoints"
        ),
        NO_ENDPOINT_NODEPORTS: (
            port_key, "vmap to drop or reject packets to service nodeports with no endpoints"
        ),
        FIREWALL_IPS: (key, "destinations that are subject to LoadBalancerSourceRanges"),
        SERVICE_IPS: (key, "ClusterIP, ExternalIP and LoadBalancer IP traffic"),
        SERVICE_NODEPORTS: (port_key, "NodePort traffic"),
    }  # fmt: skip
    for target, items in ((s.sets, sets), (s.maps, maps)):
        for name, (typ, comment) in items.items():
            target[name] = f'{{ type {typ} ; comment "{comment}" ; }}'


def _check_chains(s: Static, cfg: NftConfig, service_cidrs: tuple[IPNetwork, ...]) -> None:
    mark = cfg.proxy.masquerade.mark
    _rule(s, "masquerading", MarkTest(mark), SetMark("xor", mark), Masquerade())
    hairpin = Match((*cfg.saddr, *cfg.service_key), SetRef(HAIRPIN))
    _rule(s, "masquerading", Ct("status", "dnat"), hairpin, Masquerade())
    _rule(s, "cluster-ips-check", Match(cfg.daddr, SetRef(CLUSTER_IPS)), Verdict("reject"),
          comment="Reject traffic to invalid ports of ClusterIPs")  # fmt: skip
    cidrs = tuple(str(c) for c in service_cidrs if IPFamily.of(c) is cfg.family)
    if cidrs:
        _rule(s, "cluster-ips-check", Match(cfg.daddr, AnonSet(cidrs)), Verdict("drop"),
              comment="Drop traffic to unallocated ClusterIPs")  # fmt: skip
    helper = "helper for @no-endpoint-services / @no-endpoint-nodeports"
    s.chains[REJECT_CHAIN] = f'{{ comment "{helper}" ; }}'
    _rule(s, REJECT_CHAIN, Verdict("reject"))
    _rule(s, "service-endpoints-check", Vmap(cfg.service_key, NO_ENDPOINT_SERVICES))
    where = cfg.no_localhost if s.match_all_nodeports else Match(cfg.daddr, SetRef(NODEPORT_IPS))
    _rule(s, "nodeport-endpoints-check", where, Vmap(PORT_KEY, NO_ENDPOINT_NODEPORTS))
    _rule(s, "firewall-check", Vmap(cfg.service_key, FIREWALL_IPS))


def _localhost_rejects(s: Static, cfg: NftConfig) -> None:
    """Upstream v1.37's objects for localhost NodePorts the relay cannot serve (UDP, SCTP):
    a verdict map from the node-port checks to a counting reject chain per protocol."""
    comment = "localhost NodePorts rejected by kube-proxy"
    s.maps[LOCALHOST_REJECT_MAP] = (
        f'{{ type inet_proto . inet_service : verdict ; comment "{comment}" ; }}'
    )
    for proto in LOCALHOST_REJECTED:
        counter = localhost_reject_counter(proto)
        s.counters.append(counter)
        s.chains[localhost_reject_chain(proto)] = ""
        _rule(s, localhost_reject_chain(proto), Counter(counter), Verdict("reject"))
    _rule(s, "nodeport-endpoints-check", cfg.localhost, Vmap(PORT_KEY, LOCALHOST_REJECT_MAP))


def _services_chain(s: Static, cfg: NftConfig, node: NodeFacts) -> None:
    cluster_ips = Match(cfg.daddr, SetRef(CLUSTER_IPS))
    if cfg.proxy.masquerade.all:
        _rule(s, "services", cluster_ips, cfg.masquerade,
              comment="masquerade all clusterIP traffic")  # fmt: skip
    elif node.local_cidrs:
        outside = Match(cfg.saddr, str(node.local_cidrs[0]), negated=True)
        _rule(s, "services", cluster_ips, outside, cfg.masquerade,
              comment="masquerade clusterIP traffic from outside cluster")  # fmt: skip
    _rule(s, "services", Vmap(cfg.service_key, SERVICE_IPS))
    ports = Vmap(PORT_KEY, SERVICE_NODEPORTS)
    if s.match_all_nodeports:
        _rule(s, "services", Fib("daddr"), cfg.no_localhost, ports)
    else:
        _rule(s, "services", Match(cfg.daddr, SetRef(NODEPORT_IPS)), ports)


def static_objects(cfg: NftConfig, node: NodeFacts, service_cidrs: tuple[IPNetwork, ...]) -> Static:
    nodeport_ips = cfg.proxy.nodeport_addresses.node_ips(node.node, cfg.family)
    s = Static(match_all_nodeports=nodeport_ips is None)
    for name, ctype, hook, prio in BASE_CHAINS:
        s.chains[name] = f"{{ type {ctype} hook {hook} priority {prio} ; }}"
    for target, source, new in JUMPS:
        s.chains.setdefault(target, "")
        _rule(s, source, *((NEW,) if new else ()), Verdict("jump", target))
    for chain in ("services", "cluster-ips-check", "masquerading", "firewall-check"):
        s.chains.setdefault(chain, "")
    _containers(s, cfg)
    _check_chains(s, cfg, service_cidrs)
    if cfg.localhost_nodeports:
        _localhost_rejects(s, cfg)
    _services_chain(s, cfg, node)
    for ip in nodeport_ips or ():
        if not ip.is_loopback:  # upstream: localhost NodePorts are not supported here
            s.elements.append(Element(NODEPORT_IPS, (str(ip),)))
    return s
