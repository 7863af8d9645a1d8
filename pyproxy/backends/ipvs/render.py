"""Pure rendering of the proxy state into kube-proxy's IPVS-mode layout, one IP family at a
time (IPv6 ipsets are named ``KUBE-6-*``, as upstream).

One virtual server per service address and port (cluster IP, each node address for a
NodePort, external IPs, load-balancer IPs), real servers in masquerade mode chosen by the
shared endpoint selection, the service addresses to bind on ``kube-ipvs0``, upstream's ipsets
(pkg/proxy/ipvs/ipset.go) and the few iptables rules that match them. Session affinity is
IPVS persistence with the service's timeout, as upstream.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pyproxy.backends.xtables.rule import (
    Match,
    Part,
    Rule,
    addrtype,
    by_chain,
    comment,
    ctstate,
    match_set,
)
from pyproxy.backends.xtables.rules import (
    KUBE_FORWARD,
    KUBE_MARK_MASQ,
    KUBE_POSTROUTING,
    JumpRule,
    XtablesConfig,
    forward_rules,
    if_not_local,
    mark_masq_rules,
    postrouting_rules,
    restore_text,
)
from pyproxy.model.selection import categorize_endpoints
from pyproxy.model.types import (
    Endpoint,
    IPAddress,
    IPFamily,
    IPNetwork,
    NodeInfo,
    Protocol,
    ServicePort,
)

DUMMY = "kube-ipvs0"
PROTO_NUM = {Protocol.TCP: 6, Protocol.UDP: 17, Protocol.SCTP: 132}
PROTO_NAME = {6: "TCP", 17: "UDP", 132: "SCTP"}

VSKey = tuple[int, str, int]
DestKey = tuple[str, int]
Entry = tuple[str | int, ...]

# name: ipset type (upstream's names and types)
SETS: dict[str, str] = {
    "KUBE-CLUSTER-IP": "hash:ip,port",
    "KUBE-LOOP-BACK": "hash:ip,port,ip",
    "KUBE-EXTERNAL-IP": "hash:ip,port",
    "KUBE-EXTERNAL-IP-LOCAL": "hash:ip,port",
    "KUBE-LOAD-BALANCER": "hash:ip,port",
    "KUBE-LOAD-BALANCER-LOCAL": "hash:ip,port",
    "KUBE-LOAD-BALANCER-FW": "hash:ip,port",
    "KUBE-LOAD-BALANCER-SOURCE-CIDR": "hash:ip,port,net",
    "KUBE-NODE-PORT-TCP": "bitmap:port",
    "KUBE-NODE-PORT-LOCAL-TCP": "bitmap:port",
    "KUBE-NODE-PORT-UDP": "bitmap:port",
    "KUBE-NODE-PORT-LOCAL-UDP": "bitmap:port",
    "KUBE-NODE-PORT-SCTP-HASH": "hash:ip,port",
    "KUBE-NODE-PORT-LOCAL-SCTP-HASH": "hash:ip,port",
    "KUBE-HEALTH-CHECK-NODE-PORT": "bitmap:port",
    "KUBE-IPVS-IPS": "hash:ip",
}

NAT_CHAINS = (
    "KUBE-SERVICES",
    KUBE_POSTROUTING,
    "KUBE-NODE-PORT",
    "KUBE-LOAD-BALANCER",
    KUBE_MARK_MASQ,
)
FILTER_CHAINS = (
    KUBE_FORWARD,
    "KUBE-NODE-PORT",
    "KUBE-PROXY-FIREWALL",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
)
# upstream's iptablesJumpChain for IPVS mode; each is prepended in turn
JUMPS = (
    JumpRule("nat", "OUTPUT", "KUBE-SERVICES", "kubernetes service portals"),
    JumpRule("nat", "PREROUTING", "KUBE-SERVICES", "kubernetes service portals"),
    JumpRule("nat", "POSTROUTING", KUBE_POSTROUTING, "kubernetes postrouting rules"),
    JumpRule("filter", "FORWARD", KUBE_FORWARD, "kubernetes forwarding rules"),
    JumpRule("filter", "INPUT", "KUBE-NODE-PORT", "kubernetes health check rules"),
    JumpRule("filter", "INPUT", "KUBE-PROXY-FIREWALL", "kube-proxy firewall rules"),
    JumpRule("filter", "FORWARD", "KUBE-PROXY-FIREWALL", "kube-proxy firewall rules"),
    JumpRule("filter", "INPUT", "KUBE-IPVS-FILTER", "kubernetes ipvs access filter"),
)


def set_name(base: str, family: IPFamily) -> str:
    """Upstream's per-family ipset name: KUBE-CLUSTER-IP -> KUBE-6-CLUSTER-IP for IPv6,
    cut to the kernel's 31-character limit as upstream does."""
    return base if family is IPFamily.IPV4 else ("KUBE-6-" + base[len("KUBE-") :])[:31]


def family_sets(family: IPFamily) -> dict[str, str]:
    """Actual ipset name -> type, for one family."""
    return {set_name(n, family): t for n, t in SETS.items()}


@dataclass(frozen=True)
class IpvsConfig(XtablesConfig):
    """IPVS mode's render settings for one IP family."""

    @property
    def scheduler(self) -> str:
        """--ipvs-scheduler (this mode's own setting)."""
        return str(self.proxy.option("ipvs_scheduler", "rr"))

    @property
    def strict_arp(self) -> bool:
        return bool(self.proxy.option("ipvs_strict_arp", False))


def nodeport_ips(node: NodeInfo, cfg: IpvsConfig) -> tuple[IPAddress, ...]:
    """The addresses of ``cfg.family`` that get a virtual server per NodePort: the chosen
    --nodeport-addresses, or for "all" every local address the kernel reported (the Node
    object's addresses when rendering offline), never loopback or link-local."""
    return cfg.proxy.nodeport_addresses.listed_ips(node, cfg.family)


@dataclass
class VirtualServer:
    scheduler: str
    timeout: int
    dests: dict[DestKey, int]
    comment: str
    service_port: str = ""
    """The service port it serves (``ns/name:port``): what its statistics are counted for."""


@dataclass
class Desired:
    services: dict[VSKey, VirtualServer] = field(default_factory=dict)
    addresses: set[str] = field(default_factory=set)
    ipsets: dict[str, set[Entry]] = field(default_factory=lambda: {n: set() for n in SETS})
    iptables: IptablesRules = field(default_factory=dict)
    no_local_internal: int = 0
    no_local_external: int = 0

    @property
    def no_local(self) -> dict[str, int]:
        return {"internal": self.no_local_internal, "external": self.no_local_external}

    def listing(self) -> str:
        """An ipvsadm -Ln style listing of the virtual and real servers."""
        out = [
            "IP Virtual Server (desired state rendered by pyproxy)",
            "Prot LocalAddress:Port Scheduler Flags",
            "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn",
        ]
        for key in sorted(self.services, key=lambda k: (k[1], k[2], k[0])):
            vs = self.services[key]
            proto, addr, port = key
            flags = f" persistent {vs.timeout}" if vs.timeout else ""
            out.append(
                f"{PROTO_NAME[proto]:4} {_hostport(addr, port)} {vs.scheduler}{flags}"
                f"   # {vs.comment}"
            )
            for (ip, p), weight in sorted(vs.dests.items()):
                out.append(f"  -> {_hostport(ip, p):28} Masq    {weight:<6} 0          0")
        return "\n".join(out) + "\n"


def _hostport(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def _dests(eps: Iterable[Endpoint]) -> dict[DestKey, int]:
    return {(str(e.ip), e.port): 1 for e in eps}


IptablesRules = dict[str, list[Rule]]
"""table -> the few iptables rules of IPVS mode, in write order."""


def iptables_rules(node: NodeInfo, cfg: IpvsConfig) -> IptablesRules:
    """The few iptables rules of IPVS mode; they depend on the node, never on a service."""
    local = cfg.proxy.local_cidrs(node, cfg.family)
    return {"filter": _filter(cfg), "nat": _nat(cfg, local)}


CHAINS = {"filter": FILTER_CHAINS, "nat": NAT_CHAINS}


def iptables_text(rules: IptablesRules) -> str:
    return restore_text([(t, CHAINS[t], r) for t, r in rules.items()])


def iptables_chains(rules: IptablesRules) -> dict[str, dict[str, list[Rule]]]:
    """table -> chain -> rules (what ``trace`` walks)."""
    return {t: by_chain(r, CHAINS[t]) for t, r in rules.items()}


def render_service(
    ports: Iterable[ServicePort],
    endpoints: Iterable[tuple[Endpoint, ...]],
    node: NodeInfo,
    cfg: IpvsConfig,
    node_ips: tuple[IPAddress, ...],
) -> Desired:
    """One service's virtual servers, addresses and ipset entries (family set names), from
    its ports and each port's endpoints."""
    d = Desired()
    for svc, eps in zip(ports, endpoints, strict=True):
        _render_port(d, svc, eps, node, cfg, node_ips)
        for ep in eps:
            if ep.ready or (ep.serving and ep.terminating):
                d.ipsets["KUBE-LOOP-BACK"].add(
                    (str(ep.ip), f"{svc.protocol.value.lower()}:{ep.port}", str(ep.ip))
                )
    d.ipsets = {set_name(n, cfg.family): v for n, v in d.ipsets.items() if v}
    return d


def _render_port(
    d: Desired,
    svc: ServicePort,
    eps: tuple[Endpoint, ...],
    node: NodeInfo,
    cfg: IpvsConfig,
    node_ips: tuple[IPAddress, ...],
) -> None:
    sel = categorize_endpoints(svc, eps, node)
    timeout = svc.sticky_max_age_seconds if svc.session_affinity_client_ip else 0
    internal, external = sel.internal, sel.external
    if sel.has_any and not sel.has_internal:
        d.no_local_internal += 1
    if sel.has_any and svc.externally_accessible and not sel.has_external:
        d.no_local_external += 1

    def vs(addr: str, port: int, dests: Iterable[Endpoint], what: str) -> None:
        d.services[(PROTO_NUM[svc.protocol], addr, port)] = VirtualServer(
            cfg.scheduler, timeout, _dests(dests), f"{svc.name} {what}", str(svc.name)
        )

    cip = str(svc.cluster_ip(cfg.family))
    vs(cip, svc.port, internal, "cluster IP")
    for eip in map(str, svc.external_ips):
        vs(eip, svc.port, external, "external IP")
    for lb in map(str, svc.load_balancer_ips):
        vs(lb, svc.port, external, "loadbalancer IP")
    bound = {cip, *map(str, svc.external_ips), *map(str, svc.load_balancer_ips)}
    d.addresses |= bound
    d.ipsets["KUBE-IPVS-IPS"] |= {(addr,) for addr in bound}
    if svc.node_port:
        for ip in node_ips:
            vs(str(ip), svc.node_port, external, "node port")
    _address_sets(d.ipsets, svc, cip)
    _port_sets(d.ipsets, svc, node_ips)


def _address_sets(sets: dict[str, set[Entry]], svc: ServicePort, cip: str) -> None:
    """ipset members for the service's addresses (upstream's ipset.go sets)."""
    port = f"{svc.protocol.value.lower()}:{svc.port}"
    sets["KUBE-CLUSTER-IP"].add((cip, port))
    for eip in map(str, svc.external_ips):
        local = svc.external_policy_local
        sets["KUBE-EXTERNAL-IP-LOCAL" if local else "KUBE-EXTERNAL-IP"].add((eip, port))
    for lb in map(str, svc.load_balancer_ips):
        entry = (lb, port)
        sets["KUBE-LOAD-BALANCER"].add(entry)
        if svc.external_policy_local:
            sets["KUBE-LOAD-BALANCER-LOCAL"].add(entry)
        if svc.load_balancer_source_ranges:
            sets["KUBE-LOAD-BALANCER-FW"].add(entry)
            for cidr in svc.load_balancer_source_ranges:
                sets["KUBE-LOAD-BALANCER-SOURCE-CIDR"].add((*entry, str(cidr)))


def _port_sets(
    sets: dict[str, set[Entry]], svc: ServicePort, node_ips: tuple[IPAddress, ...]
) -> None:
    """ipset members for NodePorts and health-check node ports."""
    if svc.node_port and svc.protocol is Protocol.SCTP:
        local = svc.external_policy_local
        target = "KUBE-NODE-PORT-LOCAL-SCTP-HASH" if local else "KUBE-NODE-PORT-SCTP-HASH"
        for ip in node_ips:
            sets[target].add((str(ip), f"sctp:{svc.node_port}"))
    elif svc.node_port:
        up = svc.protocol.value
        sets[f"KUBE-NODE-PORT-{up}"].add((svc.node_port,))
        if svc.external_policy_local:
            sets[f"KUBE-NODE-PORT-LOCAL-{up}"].add((svc.node_port,))
    if svc.health_check_node_port:
        sets["KUBE-HEALTH-CHECK-NODE-PORT"].add((svc.health_check_node_port,))


def _nat(cfg: IpvsConfig, local_cidrs: tuple[IPNetwork, ...]) -> list[Rule]:
    def in_set(name: str, flags: str = "dst,dst") -> tuple[Part, ...]:
        return match_set(set_name(name, cfg.family), flags)

    not_local = if_not_local(local_cidrs)
    masq_src = () if cfg.proxy.masquerade.all or not_local is None else not_local
    svc, lb, np = "KUBE-SERVICES", "KUBE-LOAD-BALANCER", "KUBE-NODE-PORT"
    nat = [
        Rule(KUBE_POSTROUTING, (
            *comment("Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"),
            *in_set("KUBE-LOOP-BACK", "dst,dst,src")), "MASQUERADE"),
        *postrouting_rules(cfg.mark, cfg.random_fully),
        *mark_masq_rules(cfg.mark),
        Rule(svc, (*comment("Kubernetes service lb portal"), *in_set(lb)), lb),
        Rule(svc, (*comment("Kubernetes service cluster ip + port for masquerade purpose"),
                   *in_set("KUBE-CLUSTER-IP"), *masq_src), KUBE_MARK_MASQ),
        Rule(svc, (*comment("Kubernetes service external ip + port for masquerade and filter "
                            "purpose"), *in_set("KUBE-EXTERNAL-IP")), KUBE_MARK_MASQ),
        Rule(svc, (*comment("Kubernetes service external ip + port with "
                            "externalTrafficPolicy=local"),
                   *in_set("KUBE-EXTERNAL-IP-LOCAL"), *addrtype("--src-type")), KUBE_MARK_MASQ),
        Rule(svc, addrtype("--dst-type"), np),
        Rule(svc, in_set("KUBE-CLUSTER-IP"), "ACCEPT"),
        Rule(svc, in_set(lb), "ACCEPT"),
        Rule(lb, (*comment("Kubernetes service load balancer ip + port with "
                           "externalTrafficPolicy=local"), *in_set("KUBE-LOAD-BALANCER-LOCAL")),
             "RETURN"),
        Rule(lb, (), KUBE_MARK_MASQ),
    ]  # fmt: skip
    for proto in ("TCP", "UDP"):
        p = (Match("-p", proto.lower()),)
        nat += [
            Rule(np, (*p, *comment(f"Kubernetes nodeport {proto} port with "
                                   "externalTrafficPolicy=local"),
                      *in_set(f"KUBE-NODE-PORT-LOCAL-{proto}", "dst")), "RETURN"),
            Rule(np, (*p, *comment(f"Kubernetes nodeport {proto} port for masquerade purpose"),
                      *in_set(f"KUBE-NODE-PORT-{proto}", "dst")), KUBE_MARK_MASQ),
        ]  # fmt: skip
    sctp = (Match("-p", "sctp"),)
    return [
        *nat,
        Rule(np, (*sctp, *comment("Kubernetes nodeport SCTP port with "
                                  "externalTrafficPolicy=local"),
                  *in_set("KUBE-NODE-PORT-LOCAL-SCTP-HASH")), "RETURN"),
        Rule(np, (*sctp, *comment("Kubernetes nodeport SCTP port for masquerade purpose"),
                  *in_set("KUBE-NODE-PORT-SCTP-HASH")), KUBE_MARK_MASQ),
    ]  # fmt: skip


def _filter(cfg: IpvsConfig) -> list[Rule]:
    def in_set(name: str, flags: str = "dst,dst") -> tuple[Part, ...]:
        return match_set(set_name(name, cfg.family), flags)

    ranges, ipvs = "KUBE-SOURCE-RANGES-FIREWALL", "KUBE-IPVS-FILTER"
    return [
        *forward_rules(cfg.mark, cfg.conntrack_tcp_liberal),
        Rule("KUBE-NODE-PORT", (*comment("Kubernetes health check node port"),
                                *in_set("KUBE-HEALTH-CHECK-NODE-PORT", "dst")), "ACCEPT"),
        Rule("KUBE-PROXY-FIREWALL", (
            *comment("Kubernetes service load balancer ip + port for load balancer with "
                     "sourceRange"), *in_set("KUBE-LOAD-BALANCER-FW")), ranges),
        Rule(ranges, (*comment("Kubernetes service load balancer source ranges"),
                      *in_set("KUBE-LOAD-BALANCER-SOURCE-CIDR", "dst,dst,src")), "RETURN"),
        Rule(ranges, (), "DROP"),
        *(Rule(ipvs, in_set(n), "RETURN") for n in (
            "KUBE-LOAD-BALANCER", "KUBE-CLUSTER-IP", "KUBE-EXTERNAL-IP",
            "KUBE-EXTERNAL-IP-LOCAL")),
        Rule(ipvs, in_set("KUBE-HEALTH-CHECK-NODE-PORT", "dst"), "RETURN"),
        # Nothing else on a service address: not the host's own services through it
        # (upstream's rule for kubernetes#72236).
        Rule(ipvs, (*ctstate("NEW"), *in_set("KUBE-IPVS-IPS", "dst")), "REJECT"),
    ]  # fmt: skip
