"""The userspace backend: kube-proxy's original design. Every TCP/UDP service port gets a
listener in pyproxy (``relay``) on a port the kernel picks, and nat rules REDIRECT the
service's cluster IP, external IPs, load-balancer IPs (PREROUTING for pods and clients,
OUTPUT for the host) and NodePorts to it. Rules are applied with one iptables-restore through
the shared kernel layer; services without endpoints are REJECTed in the filter table, as in
iptables mode, so clients get "connection refused". SCTP is not supported in this mode.
externalTrafficPolicy=Local is not honoured here (as in upstream's userspace mode): the
relay is on the node, so the client address is never preserved anyway.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from dataclasses import replace

from prometheus_client import CollectorRegistry, Gauge

from pyproxy.backends.base import (
    Backend,
    BackendError,
    BackendUnavailable,
    Difference,
    ServiceTraffic,
    SyncRequest,
    SyncResult,
    by_service_port,
)
from pyproxy.backends.relay import PortSpec, Relay
from pyproxy.backends.trace import AFFINITY_NOTE, RELAY, Outcome, Packet, Trace
from pyproxy.backends.xtables.compare import compare as xtables_compare
from pyproxy.backends.xtables.rules import NEW, JumpRule
from pyproxy.backends.xtables.tables import cleanup_everywhere, ensure_jumps, open_tables
from pyproxy.backends.xtables.walk import Walker
from pyproxy.config.settings import ProxyConfig
from pyproxy.kernel.iptables import Iptables, IptablesError
from pyproxy.model.selection import categorize_endpoints
from pyproxy.model.types import IPFamily, Protocol, ProxyState, ServicePort

log = logging.getLogger(__name__)

NAT_CHAINS = (
    "KUBE-PORTALS-CONTAINER",
    "KUBE-PORTALS-HOST",
    "KUBE-NODEPORT-CONTAINER",
    "KUBE-NODEPORT-HOST",
)
FILTER_CHAINS = ("KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES")
LOCAL = ("-m", "addrtype", "--dst-type", "LOCAL")
PORTALS = "handle ClusterIPs; NOTE: this must be before the NodePort rules"
NODEPORTS = "handle service NodePorts; NOTE: this must be the last rule in the chain"
# Each is prepended in turn, so within a chain the last listed ends up first.
JUMPS = (
    JumpRule("nat", "PREROUTING", "KUBE-NODEPORT-CONTAINER", NODEPORTS, LOCAL),
    JumpRule("nat", "OUTPUT", "KUBE-NODEPORT-HOST", NODEPORTS, LOCAL),
    JumpRule("nat", "PREROUTING", "KUBE-PORTALS-CONTAINER", PORTALS),
    JumpRule("nat", "OUTPUT", "KUBE-PORTALS-HOST", PORTALS),
    JumpRule("filter", "FORWARD", "KUBE-SERVICES", "kubernetes service portals", NEW),
    JumpRule("filter", "OUTPUT", "KUBE-SERVICES", "kubernetes service portals", NEW),
    JumpRule(
        "filter",
        "INPUT",
        "KUBE-EXTERNAL-SERVICES",
        "kubernetes externally-visible service portals",
        NEW,
    ),
)


def key_of(sp: ServicePort) -> str:
    return f"{sp.name}/{sp.protocol.value}"


def specs(state: ProxyState) -> dict[str, PortSpec]:
    """The listeners the state needs (TCP/UDP IPv4 service ports with endpoints)."""
    out: dict[str, PortSpec] = {}
    for sp in state.sorted_services(IPFamily.IPV4):
        if sp.protocol is Protocol.SCTP:
            continue
        sel = categorize_endpoints(sp, state.endpoints_for(sp.name, IPFamily.IPV4), state.node)
        eps = sel.local if sp.internal_policy_local else sel.cluster
        if not eps:
            continue
        out[key_of(sp)] = PortSpec(
            sp.protocol.value.lower(),
            tuple((str(e.ip), e.port) for e in eps),
            sp.sticky_max_age_seconds if sp.session_affinity_client_ip else 0,
            str(sp.name),
        )
    return out


_TO_PORTS = re.compile(r"--to-ports \d+")
RELAY_PORT = "--to-ports <relay port>"


def _listener(key: str) -> str:
    """The relay's port in a render without listeners (the kernel picks it at run time)."""
    return f"<listener:{key}>"


def render_rules(state: ProxyState, ports: Mapping[str, int] | None) -> str:
    """nat + filter rules; ``ports`` maps listener keys to local ports (None: placeholders)."""
    nat = ["*nat", *(f":{c} - [0:0]" for c in NAT_CHAINS)]
    filt = ["*filter", *(f":{c} - [0:0]" for c in FILTER_CHAINS)]
    listening = ports if ports is not None else specs(state)
    for sp in state.sorted_services(IPFamily.IPV4):
        proto = sp.protocol.value.lower()
        name = str(sp.name)
        addrs = [
            str(sp.cluster_ip(IPFamily.IPV4)),
            *map(str, sp.external_ips),
            *map(str, sp.load_balancer_ips),
        ]
        if sp.protocol is Protocol.SCTP:
            continue
        key = key_of(sp)
        has = key in listening
        if not has:
            for addr in addrs:
                filt.append(
                    f'-A KUBE-SERVICES -m comment --comment "{name} has no endpoints" '
                    f"-m {proto} -p {proto} -d {addr} --dport {sp.port} -j REJECT"
                )
            if sp.node_port:
                filt.append(
                    f'-A KUBE-EXTERNAL-SERVICES -m comment --comment "{name} has no '
                    f'endpoints" -m addrtype --dst-type LOCAL -m {proto} -p {proto} '
                    f"--dport {sp.node_port} -j REJECT"
                )
            continue
        to = str(ports[key]) if ports is not None else _listener(key)
        for chain in ("KUBE-PORTALS-CONTAINER", "KUBE-PORTALS-HOST"):
            for addr in addrs:
                nat.append(
                    f'-A {chain} -m comment --comment "{name}" -m {proto} -p {proto} '
                    f"-d {addr} --dport {sp.port} -j REDIRECT --to-ports {to}"
                )
        if sp.node_port:
            for chain in ("KUBE-NODEPORT-CONTAINER", "KUBE-NODEPORT-HOST"):
                nat.append(
                    f'-A {chain} -m comment --comment "{name}" -m {proto} -p {proto} '
                    f"--dport {sp.node_port} -j REDIRECT --to-ports {to}"
                )
    return "\n".join([*filt, "COMMIT", *nat, "COMMIT"]) + "\n"


class UserspaceBackend(Backend):
    mode = "userspace"

    def __init__(
        self,
        cfg: ProxyConfig,
        connect_timeout: float = 1.0,
        udp_idle_timeout: float = 30.0,
        max_connections: int = 1000,
    ) -> None:
        self.proxy = cfg
        self._opts = (connect_timeout, udp_idle_timeout, max_connections)
        self._ipt: Iptables | None = None
        self._relay: Relay | None = None
        self._warned_sctp: set[str] = set()
        self._listeners: Gauge | None = None

    def register_metrics(self, registry: CollectorRegistry) -> None:
        self._listeners = Gauge(
            "pyproxy_userspace_listeners",
            "Service ports the userspace relay listens for",
            registry=registry,
        )

    @property
    def relay(self) -> Relay:
        if self._relay is None:
            c, u, m = self._opts
            self._relay = Relay(connect_timeout=c, udp_idle_timeout=u, max_connections=m)
        return self._relay

    def render(self, state: ProxyState) -> str:
        return "# listeners are opened on ports the kernel picks at run time\n" + render_rules(
            state, None
        )

    def trace(self, state: ProxyState, packet: Packet) -> Trace:
        """The REDIRECT rules walked as in iptables mode (listener ports numbered in order),
        then the relay: round robin, so each endpoint gets an equal share, and the endpoint
        sees the node's address, never the client's."""
        if packet.family is not IPFamily.IPV4 or packet.protocol is Protocol.SCTP:
            raise BackendUnavailable("userspace mode relays IPv4 TCP and UDP only")

        def make() -> tuple[Walker, dict[str, PortSpec]]:
            local = state.node.local_addresses
            return (Walker(render_rules(state, None), JUMPS, local, "0x0"),
                    {_listener(key): spec for key, spec in specs(state).items()})  # fmt: skip

        walker, wanted = self.walker(state, IPFamily.IPV4, make)
        out: list[Outcome] = []
        for o in walker.walk(packet):
            if o.verdict != RELAY:
                out.append(o)
                continue
            spec = wanted[o.endpoint]
            note = (AFFINITY_NOTE,) if spec.affinity_seconds else ()
            step = f"relay {spec.name}: round robin over {len(spec.endpoints)} endpoint(s)"
            for host, port in spec.endpoints:
                out.append(replace(o, probability=o.probability / len(spec.endpoints),
                                   endpoint=f"{host}:{port}", masquerade=True,
                                   steps=(*o.steps, step), notes=o.notes + note))  # fmt: skip
        return Trace(packet, self.mode, tuple(out))

    def compare(self, state: ProxyState) -> list[Difference]:
        """The REDIRECT and REJECT rules against the kernel's. The relay's ports are the
        daemon's (the kernel picks them), so every --to-ports reads <relay port> on both
        sides: a rule missing, extra or changed shows; which port it names does not."""
        tables = open_tables(self.proxy.iptables_backend, (IPFamily.IPV4,), self.mode,
                             writes=False)  # fmt: skip
        text = render_rules(state, dict.fromkeys(specs(state), 1))
        return xtables_compare(tables[IPFamily.IPV4], text, JUMPS, canary=False,
                               normalize=lambda line: _TO_PORTS.sub(RELAY_PORT, line))  # fmt: skip

    def service_traffic(self) -> dict[str, ServiceTraffic]:
        """The relay's own counts: connections (TCP) and flows (UDP) it relayed, and the
        payload bytes both ways; it sees no packets."""
        return by_service_port(
            (name, ServiceTraffic(connections, None, octets))
            for name, connections, octets in self.relay.traffic().values()
        )

    def prepare(self) -> None:
        self._tables()

    def _tables(self) -> Iptables:
        """The IPv4 iptables the REDIRECT rules go to; BackendUnavailable when none can be
        written here (the daemon then ends at start, as the other modes do)."""
        if self._ipt is None:
            tables = open_tables(self.proxy.iptables_backend, (IPFamily.IPV4,), self.mode)
            self._ipt = tables[IPFamily.IPV4]
        return self._ipt

    def sync(self, request: SyncRequest) -> SyncResult:
        t0 = time.monotonic()
        ipt = self._tables()
        for sp in request.state.services.values():
            if sp.protocol is Protocol.SCTP and str(sp.name) not in self._warned_sctp:
                self._warned_sctp.add(str(sp.name))
                log.warning("%s: SCTP is not supported in userspace mode; skipped", sp.name)
        wanted = specs(request.state)
        ports = self.relay.apply(wanted)
        text = render_rules(request.state, ports)
        t1 = time.monotonic()
        try:
            with self.transactions.applying(ipt.restore_label, text):
                ipt.restore(text)
        except IptablesError as err:
            raise BackendError(f"iptables-restore failed: {err}") from None
        if request.full:
            declared = {("nat", c) for c in NAT_CHAINS} | {("filter", c) for c in FILTER_CHAINS}
            ensure_jumps(ipt, JUMPS, declared)
        if self._listeners is not None:
            self._listeners.set(len(ports))
        return SyncResult(
            full=True,
            families=(IPFamily.IPV4,),
            render_seconds=t1 - t0,
            apply_seconds=time.monotonic() - t1,
        )

    def cleanup(self) -> None:
        cleanup_everywhere(
            JUMPS, {"nat": NAT_CHAINS, "filter": FILTER_CHAINS}, families=(IPFamily.IPV4,)
        )

    def close(self) -> None:
        if self._relay is not None:
            self._relay.close()
