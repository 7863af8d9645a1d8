"""userspace mode's objects per service on the engine's cache: each TCP/UDP port's listener
(what the relay serves) and its rules, REDIRECT to the listener or REJECT when nothing
listens. A listener's port is the kernel's pick at run time, so the rules name it by key and
the writer fills in the port the relay got. Pure: nothing here touches the kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyproxy.backends.engine.cache import Entry, ServiceCache, ServiceTable
from pyproxy.backends.relay import PortSpec
from pyproxy.backends.xtables.rule import Rule, addrtype, by_chain, comment, dport
from pyproxy.backends.xtables.rules import restore_text
from pyproxy.model.selection import categorize_endpoints
from pyproxy.model.types import (
    Endpoint,
    IPFamily,
    NamespacedName,
    NodeInfo,
    Protocol,
    ProxyState,
    ServicePort,
)

NAT_CHAINS = (
    "KUBE-PORTALS-CONTAINER",
    "KUBE-PORTALS-HOST",
    "KUBE-NODEPORT-CONTAINER",
    "KUBE-NODEPORT-HOST",
)
FILTER_CHAINS = ("KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES")


def key_of(sp: ServicePort) -> str:
    return f"{sp.name}/{sp.protocol.value}"


def listener(key: str) -> str:
    """How a rule names a listener's port until the relay has one."""
    return f"<listener:{key}>"


@dataclass(frozen=True)
class PortRules:
    """One service port's listener (None: no endpoints) and rules."""

    key: str
    spec: PortSpec | None
    redirect: tuple[Rule, ...]
    """nat rules to the listener (its port as ``listener(key)``)."""
    reject: tuple[Rule, ...]
    """filter rules refusing the port's traffic, used when nothing listens for it."""


@dataclass
class ServiceRules:
    ports: tuple[PortRules, ...]
    no_local_internal: int = 0
    no_local_external: int = 0


def render_port(sp: ServicePort, eps: tuple[Endpoint, ...], node: NodeInfo) -> PortRules:
    proto = sp.protocol.value.lower()
    name = str(sp.name)
    key = key_of(sp)
    addrs = [str(sp.cluster_ip(IPFamily.IPV4)), *map(str, sp.external_ips),
             *map(str, sp.load_balancer_ips)]  # fmt: skip
    sel = categorize_endpoints(sp, eps, node)
    chosen = sel.local if sp.internal_policy_local else sel.cluster
    spec = None
    if chosen:
        spec = PortSpec(
            proto,
            tuple((str(e.ip), e.port) for e in chosen),
            sp.sticky_max_age_seconds if sp.session_affinity_client_ip else 0,
            name,
        )
    why = comment(f"{name} has no endpoints")
    reject = [Rule("KUBE-SERVICES", (*why, *dport(proto, sp.port, a)), "REJECT") for a in addrs]
    if sp.node_port:
        reject.append(
            Rule(
                "KUBE-EXTERNAL-SERVICES",
                (*why, *addrtype("--dst-type"), *dport(proto, sp.node_port)),
                "REJECT",
            )
        )
    to = ("--to-ports", listener(key))
    redirect = [
        Rule(chain, (*comment(name), *dport(proto, sp.port, a)), "REDIRECT", to)
        for chain in ("KUBE-PORTALS-CONTAINER", "KUBE-PORTALS-HOST")
        for a in addrs
    ]
    if sp.node_port:
        redirect += [
            Rule(chain, (*comment(name), *dport(proto, sp.node_port)), "REDIRECT", to)
            for chain in ("KUBE-NODEPORT-CONTAINER", "KUBE-NODEPORT-HOST")
        ]
    return PortRules(key, spec, tuple(redirect), tuple(reject))


def render_service(
    ports: tuple[ServicePort, ...], eps: tuple[tuple[Endpoint, ...], ...], node: NodeInfo
) -> ServiceRules:
    """SCTP ports are left out: the relay serves TCP and UDP only."""
    return ServiceRules(tuple(render_port(sp, e, node) for sp, e in zip(ports, eps, strict=True)
                              if sp.protocol is not Protocol.SCTP))  # fmt: skip


class UserspaceTable(ServiceTable[ServiceRules]):
    def specs(self) -> dict[str, PortSpec]:
        """The listeners the relay must serve."""
        return {p.key: p.spec for e in self.entries.values() for p in e.objects.ports
                if p.spec is not None}  # fmt: skip

    def rules(self, ports: Mapping[str, int] | None) -> dict[str, list[Rule]]:
        """table -> its rules in write order; ``ports`` maps listener keys to the relay's
        ports (None: every listener named, as ``render`` prints it)."""
        out: dict[str, list[Rule]] = {"filter": [], "nat": []}
        for svc in sorted(self.entries):
            for p in self.entries[svc].objects.ports:
                if p.spec is None or (ports is not None and p.key not in ports):
                    out["filter"] += p.reject
                elif ports is None:
                    out["nat"] += p.redirect
                else:
                    to = ("--to-ports", str(ports[p.key]))
                    out["nat"] += [r._replace(target_args=to) for r in p.redirect]
        return out

    def chains(self, ports: Mapping[str, int] | None) -> dict[str, dict[str, list[Rule]]]:
        """table -> chain -> rules (what ``trace`` walks)."""
        rules = self.rules(ports)
        return {"filter": by_chain(rules["filter"], FILTER_CHAINS),
                "nat": by_chain(rules["nat"], NAT_CHAINS)}  # fmt: skip

    def text(self, ports: Mapping[str, int] | None) -> str:
        """iptables-restore input for the whole table (``ports`` as for ``rules``)."""
        rules = self.rules(ports)
        return restore_text([("filter", FILTER_CHAINS, rules["filter"]),
                             ("nat", NAT_CHAINS, rules["nat"])])  # fmt: skip

    def with_updates(
        self, updates: Mapping[NamespacedName, Entry[ServiceRules] | None]
    ) -> UserspaceTable:
        """A new table: this one with ``updates`` applied (this one unchanged)."""
        entries = {svc: e for svc, e in self.entries.items() if svc not in updates}
        entries.update({svc: e for svc, e in updates.items() if e is not None})
        return UserspaceTable(self.facts, entries)


class UserspaceCache(ServiceCache[ServiceRules, NodeInfo, UserspaceTable]):
    def __init__(self) -> None:
        super().__init__(IPFamily.IPV4, lambda state, n: state.node, render_service)

    def table(
        self,
        state: ProxyState,
        facts: NodeInfo,
        entries: Mapping[NamespacedName, Entry[ServiceRules]],
    ) -> UserspaceTable:
        return UserspaceTable(facts, entries)


def render_rules(state: ProxyState, ports: Mapping[str, int] | None) -> str:
    """nat + filter rules; ``ports`` maps listener keys to local ports (None: placeholders)."""
    return UserspaceCache().render(state).text(ports)
