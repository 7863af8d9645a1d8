"""Pure rendering of the proxy state into kube-proxy's iptables layout, one IP family at a time.

The rule text follows upstream's iptables proxier (pkg/proxy/iptables/proxier.go,
``syncProxyRules`` and ``writeServiceToEndpointRules``) so that an operator who knows
kube-proxy can read it: same chains, hashed names, comments, mark and probabilities.

The result keeps the top-level chains (KUBE-SERVICES, KUBE-NODEPORTS, ...) apart from each
service's own chains, so the applier can write a full sync, or a partial one that touches
only the changed services' chains plus the changed lines of the top-level chains.
Nothing here reads the kernel: node addresses come in through ``IptablesConfig``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pyproxy.backends.iptables import names
from pyproxy.model.selection import categorize_endpoints
from pyproxy.model.types import (
    Endpoint,
    IPAddress,
    IPFamily,
    IPNetwork,
    NamespacedName,
    ProxyState,
    ServicePort,
)

KUBE_SERVICES = "KUBE-SERVICES"
KUBE_EXTERNAL_SERVICES = "KUBE-EXTERNAL-SERVICES"
KUBE_FORWARD = "KUBE-FORWARD"
KUBE_NODEPORTS = "KUBE-NODEPORTS"
KUBE_PROXY_FIREWALL = "KUBE-PROXY-FIREWALL"
KUBE_FIREWALL = "KUBE-FIREWALL"
KUBE_POSTROUTING = "KUBE-POSTROUTING"
KUBE_MARK_MASQ = "KUBE-MARK-MASQ"
KUBE_PROXY_CANARY = "KUBE-PROXY-CANARY"

FILTER_TOP = (
    KUBE_SERVICES,
    KUBE_EXTERNAL_SERVICES,
    KUBE_FORWARD,
    KUBE_NODEPORTS,
    KUBE_PROXY_FIREWALL,
)
NAT_TOP = (KUBE_SERVICES, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_MARK_MASQ)

# Upstream drops per-endpoint comments above this many endpoints (largeClusterMode).
LARGE_CLUSTER_ENDPOINTS = 1000


@dataclass(frozen=True)
class JumpRule:
    """A rule pyproxy inserts into a built-in chain (not through iptables-restore)."""

    table: str
    src: str
    dst: str
    comment: str
    extra: tuple[str, ...] = ()

    def args(self) -> list[str]:
        return [*self.extra, "-m", "comment", "--comment", self.comment, "-j", self.dst]


# Upstream's iptablesJumpChains (+ kubelet's KUBE-FIREWALL jumps when localhost NodePorts).
JUMP_RULES = (
    JumpRule(
        "filter",
        "INPUT",
        KUBE_EXTERNAL_SERVICES,
        "kubernetes externally-visible service portals",
        ("-m", "conntrack", "--ctstate", "NEW"),
    ),
    JumpRule(
        "filter",
        "FORWARD",
        KUBE_EXTERNAL_SERVICES,
        "kubernetes externally-visible service portals",
        ("-m", "conntrack", "--ctstate", "NEW"),
    ),
    JumpRule("filter", "INPUT", KUBE_NODEPORTS, "kubernetes health check service ports"),
    JumpRule(
        "filter",
        "FORWARD",
        KUBE_SERVICES,
        "kubernetes service portals",
        ("-m", "conntrack", "--ctstate", "NEW"),
    ),
    JumpRule(
        "filter",
        "OUTPUT",
        KUBE_SERVICES,
        "kubernetes service portals",
        ("-m", "conntrack", "--ctstate", "NEW"),
    ),
    JumpRule("filter", "FORWARD", KUBE_FORWARD, "kubernetes forwarding rules"),
    JumpRule(
        "filter",
        "INPUT",
        KUBE_PROXY_FIREWALL,
        "kubernetes load balancer firewall",
        ("-m", "conntrack", "--ctstate", "NEW"),
    ),
    JumpRule(
        "filter",
        "OUTPUT",
        KUBE_PROXY_FIREWALL,
        "kubernetes load balancer firewall",
        ("-m", "conntrack", "--ctstate", "NEW"),
    ),
    JumpRule(
        "filter",
        "FORWARD",
        KUBE_PROXY_FIREWALL,
        "kubernetes load balancer firewall",
        ("-m", "conntrack", "--ctstate", "NEW"),
    ),
    JumpRule("nat", "OUTPUT", KUBE_SERVICES, "kubernetes service portals"),
    JumpRule("nat", "PREROUTING", KUBE_SERVICES, "kubernetes service portals"),
    JumpRule("nat", "POSTROUTING", KUBE_POSTROUTING, "kubernetes postrouting rules"),
)
KUBELET_FIREWALL_JUMPS = (
    JumpRule("filter", "INPUT", KUBE_FIREWALL, "kubernetes firewall for dropping marked packets"),
    JumpRule("filter", "OUTPUT", KUBE_FIREWALL, "kubernetes firewall for dropping marked packets"),
)


@dataclass(frozen=True)
class IptablesConfig:
    family: IPFamily = IPFamily.IPV4
    masquerade_bit: int = 14
    masquerade_all: bool = False
    cluster_cidrs: tuple[IPNetwork, ...] = ()
    localhost_nodeports: bool = True
    nodeport_ips: tuple[IPAddress, ...] | None = None
    """None means every local address (``--nodeport-addresses`` unset or ``all``)."""
    node_ips: tuple[IPAddress, ...] = ()
    """This node's addresses; a source range holding one lets the node reach its LB IPs."""
    conntrack_tcp_liberal: bool = False
    random_fully: bool = True

    @property
    def mark(self) -> str:
        return f"{1 << self.masquerade_bit:#x}"

    @property
    def local_cidr(self) -> IPNetwork | None:
        for cidr in self.cluster_cidrs:
            if IPFamily.of(cidr) is self.family:
                return cidr
        return None

    @property
    def localhost_enabled(self) -> bool:
        return self.localhost_nodeports and self.family is IPFamily.IPV4

    def jump_rules(self) -> tuple[JumpRule, ...]:
        return JUMP_RULES + (KUBELET_FIREWALL_JUMPS if self.localhost_enabled else ())


@dataclass
class ServiceRender:
    """Everything one service contributes, split into top-level lines and own chains."""

    top_filter: dict[str, list[str]] = field(default_factory=dict)
    top_nat: dict[str, list[str]] = field(default_factory=dict)
    chains: dict[str, list[str]] = field(default_factory=dict)
    """Own nat chains (SVC/SVL/EXT/FW/SEP) in write order, each with its full rule lines."""
    no_local_internal: int = 0
    no_local_external: int = 0


@dataclass
class Rendered:
    family: IPFamily
    filter_top: dict[str, list[str]]
    nat_top: dict[str, list[str]]
    services: dict[NamespacedName, ServiceRender]
    extra_filter_chains: tuple[str, ...] = ()

    def service_chains(self) -> set[str]:
        return {c for s in self.services.values() for c in s.chains}

    def no_local_endpoints(self) -> dict[str, int]:
        return {
            "internal": sum(s.no_local_internal for s in self.services.values()),
            "external": sum(s.no_local_external for s in self.services.values()),
        }

    def filter_chain_names(self) -> tuple[str, ...]:
        return FILTER_TOP + self.extra_filter_chains

    def text(self, delete_chains: Iterable[str] = ()) -> str:
        """iptables-restore input of a full sync (chains in ``delete_chains`` removed)."""
        out = ["*filter"]
        out += [f":{c} - [0:0]" for c in self.filter_chain_names()]
        for c in self.filter_chain_names():
            out += self.filter_top.get(c, [])
        out.append("COMMIT")
        out.append("*nat")
        out += [f":{c} - [0:0]" for c in NAT_TOP]
        own: list[str] = []
        own_rules: list[str] = []
        for svc in self.services.values():
            for chain, lines in svc.chains.items():
                own.append(f":{chain} - [0:0]")
                own_rules += lines
        stale = sorted(set(delete_chains) - self.service_chains())
        out += own
        out += [f":{c} - [0:0]" for c in stale]
        for c in NAT_TOP:
            out += self.nat_top.get(c, [])
        out += own_rules
        out += [f"-X {c}" for c in stale]
        out.append("COMMIT")
        return "\n".join(out) + "\n"

    def rule_counts(self) -> dict[str, int]:
        return {
            "filter": sum(len(v) for v in self.filter_top.values()),
            "nat": sum(len(v) for v in self.nat_top.values())
            + sum(len(lines) for s in self.services.values() for lines in s.chains.values()),
        }


def _q(text: str) -> str:
    """Quote a comment as upstream does: only when it contains a space."""
    return f'"{text}"' if " " in text else text


def _probability(n: int) -> str:
    return f"{1.0 / n:0.10f}"


def _svc_match(proto: str, dest: IPAddress | str, port: int) -> list[str]:
    return ["-m", proto, "-p", proto, "-d", str(dest), "--dport", str(port)]


def render_service(
    svc: ServicePort,
    endpoints: tuple[Endpoint, ...],
    state: ProxyState,
    cfg: IptablesConfig,
    large: bool,
) -> ServiceRender:
    out = ServiceRender()
    spn = svc.name
    name = str(spn)
    proto = spn.protocol.value.lower()
    mark_masq = KUBE_MARK_MASQ
    cluster_ip = svc.cluster_ip(cfg.family)
    assert cluster_ip is not None  # callers pass family views only
    local_cidr = cfg.local_cidr

    sel = categorize_endpoints(svc, endpoints, state.node)
    cluster_chain = names.cluster_chain(spn)
    local_chain = names.local_chain(spn)
    ext_chain = names.external_chain(spn)
    fw_chain = names.firewall_chain(spn)
    uses_cluster_chain = bool(sel.cluster) and svc.uses_cluster_endpoints
    uses_local_chain = bool(sel.local) and svc.uses_local_endpoints

    internal_chain = cluster_chain
    has_internal = sel.has_any
    if svc.internal_policy_local:
        internal_chain = local_chain
        has_internal = has_internal and bool(sel.local)
    external_policy_chain = cluster_chain
    has_external = sel.has_any
    if svc.external_policy_local:
        external_policy_chain = local_chain
        has_external = has_external and bool(sel.local)
    uses_ext_chain = sel.has_any and svc.externally_accessible
    uses_fw = sel.has_any and bool(svc.load_balancer_ips) and bool(svc.load_balancer_source_ranges)
    lb_chain = fw_chain if uses_fw else ext_chain

    int_target = ext_target = int_comment = ext_comment = ""
    if not sel.has_any:
        int_target = ext_target = "REJECT"
        int_comment = ext_comment = _q(f"{name} has no endpoints")
    else:
        if not has_internal:
            int_target, int_comment = "DROP", _q(f"{name} has no local endpoints")
            out.no_local_internal = 1
        if not has_external:
            ext_target, ext_comment = "DROP", _q(f"{name} has no local endpoints")
            out.no_local_external = 1

    def top(table: dict[str, list[str]], chain: str, *args: str) -> None:
        table.setdefault(chain, []).append(" ".join(("-A", chain, *args)))

    def dispatch(
        table: dict[str, list[str]], chain: str, comment: str, dest: IPAddress | str, target: str
    ) -> None:
        """A top-level rule matching one service address and port."""
        top(
            table,
            chain,
            "-m",
            "comment",
            "--comment",
            comment,
            *_svc_match(proto, dest, svc.port),
            "-j",
            target,
        )

    # Cluster IP.
    if has_internal:
        dispatch(out.top_nat, KUBE_SERVICES, _q(f"{name} cluster IP"), cluster_ip, internal_chain)
    else:
        dispatch(out.top_filter, KUBE_SERVICES, int_comment, cluster_ip, int_target)

    # External IPs.
    for eip in svc.external_ips:
        if sel.has_any:
            dispatch(out.top_nat, KUBE_SERVICES, _q(f"{name} external IP"), eip, ext_chain)
        if not has_external:
            dispatch(out.top_filter, KUBE_EXTERNAL_SERVICES, ext_comment, eip, ext_target)

    # Load-balancer ingress IPs.
    for lbip in svc.load_balancer_ips:
        if sel.has_any:
            dispatch(out.top_nat, KUBE_SERVICES, _q(f"{name} loadbalancer IP"), lbip, lb_chain)
        if uses_fw:
            dispatch(
                out.top_filter,
                KUBE_PROXY_FIREWALL,
                _q(f"{name} traffic not accepted by {fw_chain}"),
                lbip,
                "DROP",
            )
    if not has_external:
        for lbip in svc.load_balancer_ips:
            dispatch(out.top_filter, KUBE_EXTERNAL_SERVICES, ext_comment, lbip, ext_target)

    # NodePorts.
    if svc.node_port:
        if sel.has_any:
            top(
                out.top_nat,
                KUBE_NODEPORTS,
                "-m",
                "comment",
                "--comment",
                _q(name),
                "-m",
                proto,
                "-p",
                proto,
                "--dport",
                str(svc.node_port),
                "-j",
                ext_chain,
            )
        if not has_external:
            top(
                out.top_filter,
                KUBE_EXTERNAL_SERVICES,
                "-m",
                "comment",
                "--comment",
                ext_comment,
                "-m",
                "addrtype",
                "--dst-type",
                "LOCAL",
                "-m",
                proto,
                "-p",
                proto,
                "--dport",
                str(svc.node_port),
                "-j",
                ext_target,
            )

    # Health-check node port.
    if svc.health_check_node_port:
        top(
            out.top_filter,
            KUBE_NODEPORTS,
            "-m",
            "comment",
            "--comment",
            _q(f"{name} health check node port"),
            "-m",
            "tcp",
            "-p",
            "tcp",
            "--dport",
            str(svc.health_check_node_port),
            "-j",
            "ACCEPT",
        )

    chains = out.chains

    def rule(chain: str, *args: str) -> None:
        chains[chain].append(" ".join(("-A", chain, *args)))

    # Internal traffic: masquerade what does not come from the cluster.
    internal_rules: list[str] = []
    if has_internal:
        match = [
            "-m",
            "comment",
            "--comment",
            _q(f"{name} cluster IP"),
            *_svc_match(proto, cluster_ip, svc.port),
        ]
        if cfg.masquerade_all:
            internal_rules.append(" ".join(("-A", internal_chain, *match, "-j", mark_masq)))
        elif local_cidr is not None:
            internal_rules.append(
                " ".join(
                    ("-A", internal_chain, *match, "!", "-s", str(local_cidr), "-j", mark_masq)
                )
            )

    if uses_ext_chain:
        chains[ext_chain] = []
        if not svc.external_policy_local:
            rule(
                ext_chain,
                "-m",
                "comment",
                "--comment",
                _q(f"masquerade traffic for {name} external destinations"),
                "-j",
                mark_masq,
            )
        else:
            if local_cidr is not None:
                rule(
                    ext_chain,
                    "-m",
                    "comment",
                    "--comment",
                    _q(f"pod traffic for {name} external destinations"),
                    "-s",
                    str(local_cidr),
                    "-j",
                    cluster_chain,
                )
            rule(
                ext_chain,
                "-m",
                "comment",
                "--comment",
                _q(f"masquerade LOCAL traffic for {name} external destinations"),
                "-m",
                "addrtype",
                "--src-type",
                "LOCAL",
                "-j",
                mark_masq,
            )
            rule(
                ext_chain,
                "-m",
                "comment",
                "--comment",
                _q(f"route LOCAL traffic for {name} external destinations"),
                "-m",
                "addrtype",
                "--src-type",
                "LOCAL",
                "-j",
                cluster_chain,
            )
        if has_external:
            rule(ext_chain, "-j", external_policy_chain)

    if uses_fw:
        chains[fw_chain] = []
        base = ("-m", "comment", "--comment", _q(f"{name} loadbalancer IP"))
        allow_node = False
        for cidr in svc.load_balancer_source_ranges:
            rule(fw_chain, *base, "-s", str(cidr), "-j", ext_chain)
            allow_node = allow_node or any(ip in cidr for ip in cfg.node_ips)
        if allow_node:
            for lbip in svc.load_balancer_ips:
                rule(fw_chain, *base, "-s", str(lbip), "-j", ext_chain)
        rule(
            fw_chain,
            "-m",
            "comment",
            "--comment",
            _q(f"other traffic to {name} will be dropped by KUBE-PROXY-FIREWALL"),
        )

    def svc_to_endpoints(chain: str, eps: tuple[Endpoint, ...]) -> None:
        chains[chain] = [line for line in internal_rules if line.startswith(f"-A {chain} ")]
        if svc.session_affinity_client_ip:
            for ep in eps:
                sep = names.endpoint_chain(spn, ep)
                comment = () if large else ("-m", "comment", "--comment", _q(f"{name} -> {ep}"))
                rule(
                    chain,
                    *comment,
                    "-m",
                    "recent",
                    "--name",
                    sep,
                    "--rcheck",
                    "--seconds",
                    str(svc.sticky_max_age_seconds),
                    "--reap",
                    "-j",
                    sep,
                )
        n = len(eps)
        for i, ep in enumerate(eps):
            sep = names.endpoint_chain(spn, ep)
            args: list[str] = []
            if not large:
                args += ["-m", "comment", "--comment", _q(f"{name} -> {ep}")]
            if i < n - 1:
                args += [
                    "-m",
                    "statistic",
                    "--mode",
                    "random",
                    "--probability",
                    _probability(n - i),
                ]
            rule(chain, *args, "-j", sep)

    if uses_cluster_chain:
        svc_to_endpoints(cluster_chain, sel.cluster)
    if uses_local_chain:
        svc_to_endpoints(local_chain, sel.local)

    for ep in sel.all_reachable:
        sep = names.endpoint_chain(spn, ep)
        chains[sep] = []
        comment: tuple[str, ...] = () if large else ("-m", "comment", "--comment", _q(name))
        rule(sep, *comment, "-s", str(ep.ip), "-j", mark_masq)
        affinity = (
            ("-m", "recent", "--name", sep, "--set") if svc.session_affinity_client_ip else ()
        )
        rule(
            sep,
            *comment,
            *affinity,
            "-m",
            proto,
            "-p",
            proto,
            "-j",
            "DNAT",
            "--to-destination",
            str(ep),
        )
    return out


def render(state: ProxyState, cfg: IptablesConfig) -> Rendered:
    """The complete rule set for ``cfg.family``."""
    services = state.sorted_services(cfg.family)
    total_eps = sum(len(state.endpoints_for(s.name, cfg.family)) for s in services)
    large = total_eps > LARGE_CLUSTER_ENDPOINTS
    filter_top: dict[str, list[str]] = {c: [] for c in FILTER_TOP}
    nat_top: dict[str, list[str]] = {c: [] for c in NAT_TOP}
    per_service: dict[NamespacedName, ServiceRender] = {}
    extra_filter: tuple[str, ...] = ()
    mark = cfg.mark

    nat_top[KUBE_POSTROUTING] += [
        f"-A {KUBE_POSTROUTING} -m mark ! --mark {mark}/{mark} -j RETURN",
        f"-A {KUBE_POSTROUTING} -j MARK --xor-mark {mark}",
        f'-A {KUBE_POSTROUTING} -m comment --comment "kubernetes service traffic requiring SNAT"'
        " -j MASQUERADE" + (" --random-fully" if cfg.random_fully else ""),
    ]
    nat_top[KUBE_MARK_MASQ].append(f"-A {KUBE_MARK_MASQ} -j MARK --or-mark {mark}")
    if cfg.localhost_enabled:
        extra_filter = (KUBE_FIREWALL,)
        filter_top[KUBE_FIREWALL] = [
            f'-A {KUBE_FIREWALL} -m comment --comment "block incoming localnet connections"'
            " -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT"
            " -j DROP"
        ]

    for svc in services:
        eps = state.endpoints_for(svc.name, cfg.family)
        sr = render_service(svc, eps, state, cfg, large)
        key = svc.name.service
        merged = per_service.get(key)
        if merged is None:
            per_service[key] = sr
        else:  # several ports of one service: one partial-sync unit
            for table_src, table_dst in (
                (sr.top_filter, merged.top_filter),
                (sr.top_nat, merged.top_nat),
            ):
                for chain, lines in table_src.items():
                    table_dst.setdefault(chain, []).extend(lines)
            merged.chains.update(sr.chains)
            merged.no_local_internal += sr.no_local_internal
            merged.no_local_external += sr.no_local_external
        for chain, lines in sr.top_filter.items():
            filter_top[chain] += lines
        for chain, lines in sr.top_nat.items():
            nat_top[chain] += lines

    # NodePorts: the tail call from KUBE-SERVICES, which must stay its last rule.
    np_comment = '"kubernetes service nodeports; NOTE: this must be the last rule in this chain"'
    if cfg.nodeport_ips is None:
        dest = ["-m", "addrtype", "--dst-type", "LOCAL"]
        if cfg.family is IPFamily.IPV6:
            dest += ["!", "-d", "::1/128"]
        elif not cfg.localhost_nodeports:
            dest += ["!", "-d", "127.0.0.0/8"]
        nat_top[KUBE_SERVICES].append(
            " ".join(
                [
                    "-A",
                    KUBE_SERVICES,
                    "-m",
                    "comment",
                    "--comment",
                    np_comment,
                    *dest,
                    "-j",
                    KUBE_NODEPORTS,
                ]
            )
        )
    else:
        for ip in cfg.nodeport_ips:
            if IPFamily.of(ip) is not cfg.family:
                continue
            if ip.is_loopback and not cfg.localhost_enabled:
                continue
            nat_top[KUBE_SERVICES].append(
                f"-A {KUBE_SERVICES} -m comment --comment {np_comment} -d {ip} -j {KUBE_NODEPORTS}"
            )

    if not cfg.conntrack_tcp_liberal:
        filter_top[KUBE_FORWARD].append(f"-A {KUBE_FORWARD} -m conntrack --ctstate INVALID -j DROP")
    filter_top[KUBE_FORWARD] += [
        f'-A {KUBE_FORWARD} -m comment --comment "kubernetes forwarding rules"'
        f" -m mark --mark {mark}/{mark} -j ACCEPT",
        f'-A {KUBE_FORWARD} -m comment --comment "kubernetes forwarding conntrack rule"'
        " -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
    ]
    return Rendered(cfg.family, filter_top, nat_top, per_service, extra_filter)
