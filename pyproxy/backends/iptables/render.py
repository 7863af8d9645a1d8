"""Pure rendering of the proxy state into kube-proxy's iptables layout, one IP family at a time.

The rule text follows upstream's iptables proxier (pkg/proxy/iptables/proxier.go,
``syncProxyRules`` and ``writeServiceToEndpointRules``) so that an operator who knows
kube-proxy can read it: same chains, hashed names, comments, mark and probabilities.

Each chain kind has its own function below. The result keeps the top-level chains
(KUBE-SERVICES, KUBE-NODEPORTS, ...) apart from each service's own chains, so the applier can
write a full sync, or a partial one that touches only the changed services' chains plus the
changed lines of the top-level chains. Node facts come from the state's ``NodeInfo``; nothing
here reads the kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from pyproxy.backends.iptables import names
from pyproxy.backends.iptables.endpoint_chain import EndpointChain, EndpointRules
from pyproxy.backends.xtables.rule import (
    Match,
    Part,
    Rule,
    addrtype,
    comment,
    ctstate,
    dport,
    fixed,
    module,
)
from pyproxy.backends.xtables.rules import (
    KUBE_FORWARD,
    KUBE_MARK_MASQ,
    KUBE_POSTROUTING,
    NEW,
    JumpRule,
    XtablesConfig,
    forward_rules,
    if_local,
    if_not_local,
    mark_masq_rules,
    postrouting_rules,
)
from pyproxy.model.selection import EndpointSelection, categorize_endpoints
from pyproxy.model.types import (
    Endpoint,
    IPAddress,
    IPFamily,
    IPNetwork,
    NodeInfo,
    ProxyState,
    ServicePort,
)

KUBE_SERVICES = "KUBE-SERVICES"
KUBE_EXTERNAL_SERVICES = "KUBE-EXTERNAL-SERVICES"
KUBE_NODEPORTS = "KUBE-NODEPORTS"
KUBE_PROXY_FIREWALL = "KUBE-PROXY-FIREWALL"
KUBE_FIREWALL = "KUBE-FIREWALL"

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

# Upstream's iptablesJumpChains; each is prepended in turn.
JUMP_RULES = (
    JumpRule(
        "filter",
        "INPUT",
        KUBE_EXTERNAL_SERVICES,
        "kubernetes externally-visible service portals",
        NEW,
    ),
    JumpRule(
        "filter",
        "FORWARD",
        KUBE_EXTERNAL_SERVICES,
        "kubernetes externally-visible service portals",
        NEW,
    ),
    JumpRule("filter", "INPUT", KUBE_NODEPORTS, "kubernetes health check service ports"),
    JumpRule("filter", "FORWARD", KUBE_SERVICES, "kubernetes service portals", NEW),
    JumpRule("filter", "OUTPUT", KUBE_SERVICES, "kubernetes service portals", NEW),
    JumpRule("filter", "FORWARD", KUBE_FORWARD, "kubernetes forwarding rules"),
    JumpRule("filter", "INPUT", KUBE_PROXY_FIREWALL, "kubernetes load balancer firewall", NEW),
    JumpRule("filter", "OUTPUT", KUBE_PROXY_FIREWALL, "kubernetes load balancer firewall", NEW),
    JumpRule("filter", "FORWARD", KUBE_PROXY_FIREWALL, "kubernetes load balancer firewall", NEW),
    JumpRule("nat", "OUTPUT", KUBE_SERVICES, "kubernetes service portals"),
    JumpRule("nat", "PREROUTING", KUBE_SERVICES, "kubernetes service portals"),
    JumpRule("nat", "POSTROUTING", KUBE_POSTROUTING, "kubernetes postrouting rules"),
)
# Jumps to the copy of kubelet's KUBE-FIREWALL, written with localhost NodePorts. Their comment
# tells them from kubelet's own, so cleanup removes pyproxy's and leaves kubelet's.
KUBELET_FIREWALL_JUMPS = (
    JumpRule("filter", "INPUT", KUBE_FIREWALL, "kubernetes firewall for dropping marked packets"),
    JumpRule("filter", "OUTPUT", KUBE_FIREWALL, "kubernetes firewall for dropping marked packets"),
)


@dataclass(frozen=True)
class IptablesConfig(XtablesConfig):
    """iptables mode's render settings for one IP family."""

    @property
    def localhost_enabled(self) -> bool:
        """NodePorts on 127.0.0.1 (route_localnet): IPv4 only, and only when the NodePort
        addresses include loopback (upstream turns the flag off otherwise)."""
        return (
            self.family is IPFamily.IPV4
            and self.proxy.localhost_nodeports
            and self.proxy.nodeport_addresses.contains_ipv4_loopback
        )

    def jump_rules(self) -> tuple[JumpRule, ...]:
        return JUMP_RULES + (KUBELET_FIREWALL_JUMPS if self.localhost_enabled else ())


@dataclass(frozen=True)
class NodeFacts:
    """The node facts one render needs, derived once per family."""

    node: NodeInfo
    local_cidrs: tuple[IPNetwork, ...]
    node_ip: IPAddress | None
    nodeport_ips: tuple[IPAddress, ...] | None


@dataclass(slots=True)
class ServiceRender:
    """Everything one service contributes, split into top-level lines and own chains."""

    top_filter: dict[str, list[Rule]] = field(default_factory=dict)
    top_nat: dict[str, list[Rule]] = field(default_factory=dict)
    chains: dict[str, Sequence[Rule]] = field(default_factory=dict)
    """Own nat chains (SVC/SVL/EXT/FW/SEP) in write order, each with its rules (an endpoint
    chain's made when read: ``EndpointChain``)."""
    kinds: dict[str, str] = field(default_factory=dict)
    """Own chain -> its kind (``names.SVC``, ...), for every chain but the endpoint chains,
    which are listed by port in ``counted`` (a large table has one per endpoint)."""
    counted: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Service port -> its endpoint chains, whose DNAT rules count its connections
    (upstream leaves the comment that would say so out of large tables)."""
    no_local_internal: int = 0
    no_local_external: int = 0

    def kind(self, chain: str) -> str:
        """The kind of one of this service's own chains: the order a batched full sync
        writes in."""
        return self.kinds.get(chain, names.SEP)

    def merge(self, other: ServiceRender) -> None:
        """Add another port of the same service: one partial-sync unit per service."""
        for src, dst in ((other.top_filter, self.top_filter), (other.top_nat, self.top_nat)):
            for chain, lines in src.items():
                dst.setdefault(chain, []).extend(lines)
        self.chains.update(other.chains)
        self.kinds.update(other.kinds)
        self.counted.update(other.counted)
        self.no_local_internal += other.no_local_internal
        self.no_local_external += other.no_local_external


# ---- one service port -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Port:
    """What one service port's rules are made of, decided once (upstream's per-service
    prologue in syncProxyRules): names, the endpoint selection, and where traffic goes."""

    sp: ServicePort
    sel: EndpointSelection
    cluster_ip: IPAddress
    large: bool

    @cached_property
    def name(self) -> str:
        return str(self.sp.name)

    @cached_property
    def svc_chain(self) -> str:
        return names.cluster_chain(self.sp.name)

    @cached_property
    def svl_chain(self) -> str:
        return names.local_chain(self.sp.name)

    @cached_property
    def ext_chain(self) -> str:
        return names.external_chain(self.sp.name)

    @cached_property
    def fw_chain(self) -> str:
        return names.firewall_chain(self.sp.name)

    @cached_property
    def sep_chains(self) -> dict[Endpoint, str]:
        return {ep: names.endpoint_chain(self.sp.name, ep) for ep in self.sel.all_reachable}

    @cached_property
    def proto(self) -> str:
        return self.sp.protocol.value.lower()

    @cached_property
    def named(self) -> tuple[Part, ...]:
        """The comment naming the service port, one object shared by all its rules."""
        return comment(self.name)

    @cached_property
    def endpoint_rules(self) -> EndpointRules:
        """What the port's endpoint chains share (no comment in a large table)."""
        named = () if self.large else self.named
        return EndpointRules(named, self.proto, self.sp.session_affinity_client_ip)

    @property
    def internal_chain(self) -> str:
        return self.svl_chain if self.sp.internal_policy_local else self.svc_chain

    @property
    def external_policy_chain(self) -> str:
        return self.svl_chain if self.sp.external_policy_local else self.svc_chain

    @property
    def uses_firewall(self) -> bool:
        sp = self.sp
        return (
            self.sel.has_any and bool(sp.load_balancer_ips) and bool(sp.load_balancer_source_ranges)
        )

    @property
    def lb_chain(self) -> str:
        return self.fw_chain if self.uses_firewall else self.ext_chain

    def refusal(self) -> tuple[str, str]:
        """(target, comment) for traffic with nowhere to go: REJECT when the service has no
        endpoints at all, DROP when a Local policy has none on this node."""
        if not self.sel.has_any:
            return "REJECT", f"{self.name} has no endpoints"
        return "DROP", f"{self.name} has no local endpoints"

    def match(self, dest: IPAddress | str, port: int | None = None) -> tuple[Part, ...]:
        return dport(self.proto, port or self.sp.port, str(dest))


Chains = dict[str, list[Rule]]


def _add(table: Chains, rule: Rule) -> None:
    table.setdefault(rule.chain, []).append(rule)


def _cluster_ip_lines(p: _Port, out: ServiceRender) -> None:
    if p.sel.has_internal:
        _add(
            out.top_nat,
            Rule(
                KUBE_SERVICES,
                (*comment(f"{p.name} cluster IP"), *p.match(p.cluster_ip)),
                p.internal_chain,
            ),
        )
    else:
        target, why = p.refusal()
        _add(out.top_filter, Rule(KUBE_SERVICES, (*comment(why), *p.match(p.cluster_ip)), target))


def _external_ip_lines(p: _Port, out: ServiceRender) -> None:
    target, why = p.refusal()
    for eip in p.sp.external_ips:
        if p.sel.has_any:
            _add(
                out.top_nat,
                Rule(
                    KUBE_SERVICES, (*comment(f"{p.name} external IP"), *p.match(eip)), p.ext_chain
                ),
            )
        if not p.sel.has_external:
            _add(
                out.top_filter, Rule(KUBE_EXTERNAL_SERVICES, (*comment(why), *p.match(eip)), target)
            )


def _load_balancer_lines(p: _Port, out: ServiceRender) -> None:
    for lbip in p.sp.load_balancer_ips:
        if p.sel.has_any:
            _add(
                out.top_nat,
                Rule(
                    KUBE_SERVICES,
                    (*comment(f"{p.name} loadbalancer IP"), *p.match(lbip)),
                    p.lb_chain,
                ),
            )
        if p.uses_firewall:
            why = f"{p.name} traffic not accepted by {p.fw_chain}"
            _add(out.top_filter, Rule(KUBE_PROXY_FIREWALL, (*comment(why), *p.match(lbip)), "DROP"))
    if not p.sel.has_external:
        target, why = p.refusal()
        for lbip in p.sp.load_balancer_ips:
            _add(
                out.top_filter,
                Rule(KUBE_EXTERNAL_SERVICES, (*comment(why), *p.match(lbip)), target),
            )


def _node_port_lines(p: _Port, out: ServiceRender) -> None:
    if not p.sp.node_port:
        return
    port = dport(p.proto, p.sp.node_port)
    if p.sel.has_any:
        _add(out.top_nat, Rule(KUBE_NODEPORTS, (*p.named, *port), p.ext_chain))
    if not p.sel.has_external:
        target, why = p.refusal()
        _add(
            out.top_filter,
            Rule(KUBE_EXTERNAL_SERVICES, (*comment(why), *addrtype("--dst-type"), *port), target),
        )


def _health_check_lines(p: _Port, out: ServiceRender) -> None:
    if p.sp.health_check_node_port:
        _add(
            out.top_filter,
            Rule(
                KUBE_NODEPORTS,
                (
                    *comment(f"{p.name} health check node port"),
                    *dport("tcp", p.sp.health_check_node_port),
                ),
                "ACCEPT",
            ),
        )


def _external_chain(p: _Port, node: NodeFacts) -> list[Rule]:
    """KUBE-EXT-*: masquerade (Cluster policy) or short-circuit pod and node traffic (Local
    policy), then on to the policy's chain."""
    chain = p.ext_chain
    out: list[Rule] = []
    if not p.sp.external_policy_local:
        why = f"masquerade traffic for {p.name} external destinations"
        out.append(Rule(chain, comment(why), KUBE_MARK_MASQ))
    else:
        pod_match = if_local(node.local_cidrs)
        if pod_match is not None:
            why = f"pod traffic for {p.name} external destinations"
            out.append(Rule(chain, (*comment(why), *pod_match), p.svc_chain))
        local = addrtype("--src-type")
        why = f"masquerade LOCAL traffic for {p.name} external destinations"
        out.append(Rule(chain, (*comment(why), *local), KUBE_MARK_MASQ))
        why = f"route LOCAL traffic for {p.name} external destinations"
        out.append(Rule(chain, (*comment(why), *local), p.svc_chain))
    if p.sel.has_external:
        out.append(Rule(chain, (), p.external_policy_chain))
    return out


def _firewall_chain(p: _Port, node: NodeFacts) -> list[Rule]:
    """KUBE-FW-*: load-balancer traffic from the allowed source ranges goes on; the rest
    falls through to KUBE-PROXY-FIREWALL's DROP."""
    chain, ext = p.fw_chain, p.ext_chain
    base = comment(f"{p.name} loadbalancer IP")
    out = [Rule(chain, (*base, Match("-s", str(c))), ext)
           for c in p.sp.load_balancer_source_ranges]  # fmt: skip
    ranges = p.sp.load_balancer_source_ranges
    if node.node_ip is not None and any(node.node_ip in cidr for cidr in ranges):
        # the node itself may reach its LB IPs
        out += [Rule(chain, (*base, Match("-s", str(ip))), ext) for ip in p.sp.load_balancer_ips]
    why = f"other traffic to {p.name} will be dropped by KUBE-PROXY-FIREWALL"
    return [*out, Rule(chain, comment(why))]


def _service_chain(
    p: _Port, chain: str, eps: tuple[Endpoint, ...], node: NodeFacts, cfg: IptablesConfig
) -> list[Rule]:
    """KUBE-SVC-* / KUBE-SVL-*: masquerade off-cluster sources (internal chain only), the
    affinity checks, then one statistic rule per endpoint (writeServiceToEndpointRules)."""
    out: list[Rule] = []
    if chain == p.internal_chain and p.sel.has_internal:
        match = (*comment(f"{p.name} cluster IP"), *p.match(p.cluster_ip))
        not_local = if_not_local(node.local_cidrs)
        if cfg.proxy.masquerade.all:
            out.append(Rule(chain, match, KUBE_MARK_MASQ))
        elif not_local is not None:
            out.append(Rule(chain, (*match, *not_local), KUBE_MARK_MASQ))
    if p.sp.session_affinity_client_ip:
        for ep in eps:
            sep = p.sep_chains[ep]
            recent = (
                module("recent"),
                Match("--name", sep),
                fixed("--rcheck"),
                fixed("--seconds", str(p.sp.sticky_max_age_seconds)),
                fixed("--reap"),
            )
            out.append(Rule(chain, (*_ep_comment(p, ep), *recent), sep))  # fmt: skip
    n = len(eps)
    for i, ep in enumerate(eps):
        statistic = _statistic(n - i) if i < n - 1 else ()
        parts = statistic if p.large else (*_ep_comment(p, ep), *statistic)
        out.append(Rule(chain, parts, p.sep_chains[ep]))
    return out


@functools.cache
def _statistic(n: int) -> tuple[Part, ...]:
    """Pick this one of the ``n`` endpoints left: one tuple per ``n``, shared by every
    service's rules (large tables carry no per-endpoint comment)."""
    return (module("statistic"), fixed("--mode", "random"), fixed("--probability", _probability(n)))


def _ep_comment(p: _Port, ep: Endpoint) -> tuple[Part, ...]:
    return () if p.large else comment(f"{p.name} -> {ep}")


def _endpoint_chain(p: _Port, ep: Endpoint) -> EndpointChain:
    """KUBE-SEP-*: masquerade hairpin traffic, remember the client for affinity, DNAT."""
    return EndpointChain(p.endpoint_rules, p.sep_chains[ep], str(ep.ip), str(ep))


def _probability(n: int) -> str:
    return f"{1.0 / n:0.10f}"


def render_port(
    sp: ServicePort, eps: tuple[Endpoint, ...], node: NodeFacts, cfg: IptablesConfig, large: bool
) -> ServiceRender:
    """Everything one service port (a family view) contributes to the rules."""
    cluster_ip = sp.cluster_ip(cfg.family)
    assert cluster_ip is not None  # callers pass family views only
    p = _Port(sp, categorize_endpoints(sp, eps, node.node), cluster_ip, large)
    out = ServiceRender()
    if p.sel.has_any:
        out.no_local_internal = int(not p.sel.has_internal)
        out.no_local_external = int(not p.sel.has_external)
    for lines in (
        _cluster_ip_lines,
        _external_ip_lines,
        _load_balancer_lines,
        _node_port_lines,
        _health_check_lines,
    ):
        lines(p, out)

    def own(kind: str, name: str, rules: list[Rule]) -> None:
        out.chains[name] = rules
        out.kinds[name] = kind

    if p.sel.has_any and sp.externally_accessible:
        own(names.EXT, p.ext_chain, _external_chain(p, node))
    if p.uses_firewall:
        own(names.FW, p.fw_chain, _firewall_chain(p, node))
    if p.sel.cluster and sp.uses_cluster_endpoints:
        own(names.SVC, p.svc_chain, _service_chain(p, p.svc_chain, p.sel.cluster, node, cfg))
    if p.sel.local and sp.uses_local_endpoints:
        own(names.SVL, p.svl_chain, _service_chain(p, p.svl_chain, p.sel.local, node, cfg))
    for ep in p.sel.all_reachable:
        out.chains[p.sep_chains[ep]] = _endpoint_chain(p, ep)
    if p.sep_chains:
        out.counted[p.name] = tuple(p.sep_chains.values())
    return out


# ---- the whole table -----------------------------------------------------------------------


def node_facts(state: ProxyState, cfg: IptablesConfig) -> NodeFacts:
    node = state.node
    return NodeFacts(
        node,
        cfg.proxy.local_cidrs(node, cfg.family),
        node.primary_ip(cfg.family),
        cfg.proxy.nodeport_addresses.node_ips(node, cfg.family),
    )


def nodeports_tail(node: NodeFacts, cfg: IptablesConfig) -> list[Rule]:
    """The jump from KUBE-SERVICES to KUBE-NODEPORTS, which must stay its last rule: for
    every local address, or one per chosen NodePort address."""
    head = comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain")
    if node.nodeport_ips is None:
        dest: tuple[Part, ...] = addrtype("--dst-type")
        if cfg.family is IPFamily.IPV6:
            dest += (Match("-d", "::1/128", negated=True),)
        elif not cfg.localhost_enabled:
            dest += (Match("-d", "127.0.0.0/8", negated=True),)
        return [Rule(KUBE_SERVICES, (*head, *dest), KUBE_NODEPORTS)]
    return [
        Rule(KUBE_SERVICES, (*head, Match("-d", str(ip))), KUBE_NODEPORTS)
        for ip in node.nodeport_ips
        if IPFamily.of(ip) is cfg.family and (not ip.is_loopback or cfg.localhost_enabled)
    ]


def static_lines(node: NodeFacts, cfg: IptablesConfig) -> tuple[Chains, Chains]:
    """(filter, nat) rules that do not depend on any service."""
    filter_top: Chains = {c: [] for c in FILTER_TOP}
    nat_top: Chains = {c: [] for c in NAT_TOP}
    nat_top[KUBE_POSTROUTING] = postrouting_rules(cfg.mark, cfg.random_fully)
    nat_top[KUBE_MARK_MASQ] = mark_masq_rules(cfg.mark)
    if cfg.localhost_enabled:
        filter_top[KUBE_FIREWALL] = [Rule(KUBE_FIREWALL, (
            *comment("block incoming localnet connections"), Match("-d", "127.0.0.0/8"),
            Match("-s", "127.0.0.0/8", negated=True),
            *ctstate("RELATED,ESTABLISHED,DNAT", negated=True)), "DROP")]  # fmt: skip
    filter_top[KUBE_FORWARD] = forward_rules(cfg.mark, cfg.conntrack_tcp_liberal)
    return filter_top, nat_top


def render_service(
    ports: Sequence[ServicePort],
    eps: Sequence[tuple[Endpoint, ...]],
    node: NodeFacts,
    cfg: IptablesConfig,
    large: bool,
) -> ServiceRender:
    """All ports of one service (family views), the unit a partial sync rewrites."""
    if len(ports) == 1:
        return render_port(ports[0], eps[0], node, cfg, large)
    out = ServiceRender()
    for sp, endpoints in zip(ports, eps, strict=True):
        out.merge(render_port(sp, endpoints, node, cfg, large))
    return out
