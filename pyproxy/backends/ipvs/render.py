"""Pure rendering of the proxy state into kube-proxy's IPVS-mode layout, one IP family at a
time (IPv6 ipsets are named ``KUBE-6-*``, as upstream).

One virtual server per service address and port (cluster IP, each node address for a
NodePort, external IPs, load-balancer IPs), real servers in masquerade mode chosen by the
shared endpoint selection, the service addresses to bind on ``kube-ipvs0``, upstream's ipsets
(pkg/proxy/ipvs/ipset.go) and the few iptables rules that match them. Session affinity is
IPVS persistence with the service's timeout, as upstream.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from pyproxy.model.selection import categorize_endpoints
from pyproxy.model.types import (
    Endpoint,
    IPAddress,
    IPFamily,
    IPNetwork,
    Protocol,
    ProxyState,
    ServicePort,
)

DUMMY = "kube-ipvs0"
SCHEDULERS = ("rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh")
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
}

NAT_CHAINS = (
    "KUBE-SERVICES",
    "KUBE-POSTROUTING",
    "KUBE-NODE-PORT",
    "KUBE-LOAD-BALANCER",
    "KUBE-MARK-MASQ",
)
FILTER_CHAINS = (
    "KUBE-FORWARD",
    "KUBE-NODE-PORT",
    "KUBE-PROXY-FIREWALL",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
)
# (table, from, to, extra match, comment): upstream's iptablesJumpChain for IPVS mode
JUMPS: tuple[tuple[str, str, str, tuple[str, ...], str], ...] = (
    ("nat", "OUTPUT", "KUBE-SERVICES", (), "kubernetes service portals"),
    ("nat", "PREROUTING", "KUBE-SERVICES", (), "kubernetes service portals"),
    ("nat", "POSTROUTING", "KUBE-POSTROUTING", (), "kubernetes postrouting rules"),
    ("filter", "FORWARD", "KUBE-FORWARD", (), "kubernetes forwarding rules"),
    ("filter", "INPUT", "KUBE-NODE-PORT", (), "kubernetes health check rules"),
    ("filter", "INPUT", "KUBE-PROXY-FIREWALL", (), "kube-proxy firewall rules"),
    ("filter", "FORWARD", "KUBE-PROXY-FIREWALL", (), "kube-proxy firewall rules"),
    ("filter", "INPUT", "KUBE-IPVS-FILTER", (), "kubernetes ipvs access filter"),
)


def set_name(base: str, family: IPFamily) -> str:
    """Upstream's per-family ipset name: KUBE-CLUSTER-IP -> KUBE-6-CLUSTER-IP for IPv6,
    cut to the kernel's 31-character limit as upstream does."""
    return base if family is IPFamily.IPV4 else ("KUBE-6-" + base[len("KUBE-") :])[:31]


def family_sets(family: IPFamily) -> dict[str, str]:
    """Actual ipset name -> type, for one family."""
    return {set_name(n, family): t for n, t in SETS.items()}


@dataclass(frozen=True)
class IpvsConfig:
    family: IPFamily = IPFamily.IPV4
    scheduler: str = "rr"
    masquerade_bit: int = 14
    masquerade_all: bool = False
    cluster_cidrs: tuple[IPNetwork, ...] = ()
    node_ips: tuple[IPAddress, ...] = ()
    """This node's addresses of ``family`` that accept NodePorts (not kube-ipvs0's)."""
    random_fully: bool = True
    conntrack_tcp_liberal: bool = False

    @property
    def mark(self) -> str:
        return f"{1 << self.masquerade_bit:#x}"

    @property
    def local_cidr(self) -> IPNetwork | None:
        version = 4 if self.family is IPFamily.IPV4 else 6
        return next((c for c in self.cluster_cidrs if c.version == version), None)


@dataclass
class VirtualServer:
    scheduler: str
    timeout: int
    dests: dict[DestKey, int]
    comment: str


@dataclass
class Desired:
    services: dict[VSKey, VirtualServer] = field(default_factory=dict)
    addresses: set[str] = field(default_factory=set)
    ipsets: dict[str, set[Entry]] = field(default_factory=lambda: {n: set() for n in SETS})
    iptables: str = ""
    no_local: dict[str, int] = field(default_factory=lambda: {"internal": 0, "external": 0})

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


def render(state: ProxyState, cfg: IpvsConfig) -> Desired:
    d = Desired()
    sets = d.ipsets
    for svc in state.sorted_services(cfg.family):
        _render_service(d, svc, state, cfg)
        for ep in state.endpoints_for(svc.name, cfg.family):
            if ep.ready or (ep.serving and ep.terminating):
                sets["KUBE-LOOP-BACK"].add(
                    (str(ep.ip), f"{svc.protocol.value.lower()}:{ep.port}", str(ep.ip))
                )
    d.ipsets = {set_name(n, cfg.family): v for n, v in d.ipsets.items()}
    d.iptables = re.sub(
        r"--match-set (KUBE-[A-Z0-9-]+)",
        lambda m: "--match-set " + set_name(m.group(1), cfg.family),
        _iptables(cfg),
    )
    return d


def _render_service(d: Desired, svc: ServicePort, state: ProxyState, cfg: IpvsConfig) -> None:
    proto = PROTO_NUM[svc.protocol]
    pname = svc.protocol.value.lower()
    name = str(svc.name)
    eps = state.endpoints_for(svc.name, cfg.family)
    sel = categorize_endpoints(svc, eps, state.node)
    timeout = svc.sticky_max_age_seconds if svc.session_affinity_client_ip else 0
    internal = sel.local if svc.internal_policy_local else sel.cluster
    external = sel.local if svc.external_policy_local else sel.cluster
    if sel.has_any and svc.internal_policy_local and not sel.local:
        d.no_local["internal"] += 1
    if sel.has_any and svc.external_policy_local and svc.externally_accessible and not sel.local:
        d.no_local["external"] += 1
    sets = d.ipsets

    def vs(addr: str, port: int, dests: Iterable[Endpoint], what: str) -> None:
        d.services[(proto, addr, port)] = VirtualServer(
            cfg.scheduler, timeout, _dests(dests), f"{name} {what}"
        )

    cip = str(svc.cluster_ip(cfg.family))
    vs(cip, svc.port, internal, "cluster IP")
    d.addresses.add(cip)
    sets["KUBE-CLUSTER-IP"].add((cip, f"{pname}:{svc.port}"))
    for eip in map(str, svc.external_ips):
        vs(eip, svc.port, external, "external IP")
        d.addresses.add(eip)
        sets["KUBE-EXTERNAL-IP-LOCAL" if svc.external_policy_local else "KUBE-EXTERNAL-IP"].add(
            (eip, f"{pname}:{svc.port}")
        )
    for lb in map(str, svc.load_balancer_ips):
        vs(lb, svc.port, external, "loadbalancer IP")
        d.addresses.add(lb)
        entry = (lb, f"{pname}:{svc.port}")
        sets["KUBE-LOAD-BALANCER"].add(entry)
        if svc.external_policy_local:
            sets["KUBE-LOAD-BALANCER-LOCAL"].add(entry)
        if svc.load_balancer_source_ranges:
            sets["KUBE-LOAD-BALANCER-FW"].add(entry)
            for cidr in svc.load_balancer_source_ranges:
                sets["KUBE-LOAD-BALANCER-SOURCE-CIDR"].add((*entry, str(cidr)))
    if svc.node_port:
        for ip in cfg.node_ips:
            vs(str(ip), svc.node_port, external, "node port")
        if svc.protocol is Protocol.SCTP:
            for ip in cfg.node_ips:
                target = (
                    "KUBE-NODE-PORT-LOCAL-SCTP-HASH"
                    if svc.external_policy_local
                    else "KUBE-NODE-PORT-SCTP-HASH"
                )
                sets[target].add((str(ip), f"sctp:{svc.node_port}"))
        else:
            up = svc.protocol.value
            sets[f"KUBE-NODE-PORT-{up}"].add((svc.node_port,))
            if svc.external_policy_local:
                sets[f"KUBE-NODE-PORT-LOCAL-{up}"].add((svc.node_port,))
    if svc.health_check_node_port:
        sets["KUBE-HEALTH-CHECK-NODE-PORT"].add((svc.health_check_node_port,))


def _iptables(cfg: IpvsConfig) -> str:
    mark = cfg.mark
    masq_src = (
        [] if cfg.masquerade_all or cfg.local_cidr is None else ["!", "-s", str(cfg.local_cidr)]
    )
    nat = ["*nat", *(f":{c} - [0:0]" for c in NAT_CHAINS)]
    nat += [
        '-A KUBE-POSTROUTING -m comment --comment "Kubernetes endpoints dst ip:port, source ip '
        'for solving hairpin purpose" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE',
        f"-A KUBE-POSTROUTING -m mark ! --mark {mark}/{mark} -j RETURN",
        f"-A KUBE-POSTROUTING -j MARK --xor-mark {mark}",
        '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" '
        "-j MASQUERADE" + (" --random-fully" if cfg.random_fully else ""),
        f"-A KUBE-MARK-MASQ -j MARK --or-mark {mark}",
        '-A KUBE-SERVICES -m comment --comment "Kubernetes service lb portal" '
        "-m set --match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER",
        '-A KUBE-SERVICES -m comment --comment "Kubernetes service cluster ip + port for '
        'masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst '
        + " ".join([*masq_src, "-j", "KUBE-MARK-MASQ"]).strip(),
        '-A KUBE-SERVICES -m comment --comment "Kubernetes service external ip + port for '
        'masquerade and filter purpose" -m set --match-set KUBE-EXTERNAL-IP dst,dst '
        "-j KUBE-MARK-MASQ",
        '-A KUBE-SERVICES -m comment --comment "Kubernetes service external ip + port with '
        'externalTrafficPolicy=local" -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst '
        "-m addrtype --src-type LOCAL -j KUBE-MARK-MASQ",
        "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT",
        "-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT",
        "-A KUBE-SERVICES -m set --match-set KUBE-LOAD-BALANCER dst,dst -j ACCEPT",
        '-A KUBE-LOAD-BALANCER -m comment --comment "Kubernetes service load balancer ip + port '
        'with externalTrafficPolicy=local" -m set --match-set KUBE-LOAD-BALANCER-LOCAL dst,dst '
        "-j RETURN",
        "-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ",
    ]
    for proto in ("TCP", "UDP"):
        p = proto.lower()
        nat += [
            f'-A KUBE-NODE-PORT -p {p} -m comment --comment "Kubernetes nodeport {proto} port '
            f'with externalTrafficPolicy=local" -m set --match-set KUBE-NODE-PORT-LOCAL-{proto} '
            "dst -j RETURN",
            f'-A KUBE-NODE-PORT -p {p} -m comment --comment "Kubernetes nodeport {proto} port '
            f'for masquerade purpose" -m set --match-set KUBE-NODE-PORT-{proto} dst '
            "-j KUBE-MARK-MASQ",
        ]
    nat += [
        '-A KUBE-NODE-PORT -p sctp -m comment --comment "Kubernetes nodeport SCTP port with '
        'externalTrafficPolicy=local" -m set --match-set KUBE-NODE-PORT-LOCAL-SCTP-HASH dst,dst '
        "-j RETURN",
        '-A KUBE-NODE-PORT -p sctp -m comment --comment "Kubernetes nodeport SCTP port for '
        'masquerade purpose" -m set --match-set KUBE-NODE-PORT-SCTP-HASH dst,dst '
        "-j KUBE-MARK-MASQ",
        "COMMIT",
    ]
    filt = ["*filter", *(f":{c} - [0:0]" for c in FILTER_CHAINS)]
    if not cfg.conntrack_tcp_liberal:
        filt.append("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP")
    filt += [
        '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" '
        f"-m mark --mark {mark}/{mark} -j ACCEPT",
        '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" '
        "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        '-A KUBE-NODE-PORT -m comment --comment "Kubernetes health check node port" '
        "-m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j ACCEPT",
        '-A KUBE-PROXY-FIREWALL -m comment --comment "Kubernetes service load balancer ip + '
        'port for load balancer with sourceRange" -m set --match-set KUBE-LOAD-BALANCER-FW '
        "dst,dst -j KUBE-SOURCE-RANGES-FIREWALL",
        '-A KUBE-SOURCE-RANGES-FIREWALL -m comment --comment "Kubernetes service load balancer '
        'source ranges" -m set --match-set KUBE-LOAD-BALANCER-SOURCE-CIDR dst,dst,src -j RETURN',
        "-A KUBE-SOURCE-RANGES-FIREWALL -j DROP",
        "-A KUBE-IPVS-FILTER -m set --match-set KUBE-LOAD-BALANCER dst,dst -j RETURN",
        "-A KUBE-IPVS-FILTER -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN",
        "-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP dst,dst -j RETURN",
        "-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -j RETURN",
        "-A KUBE-IPVS-FILTER -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j RETURN",
        "COMMIT",
    ]
    return "\n".join(filt + nat) + "\n"
