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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

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
from pyproxy.backends.engine.cache import Entry
from pyproxy.backends.engine.engine import Engine
from pyproxy.backends.relay import PortSpec, Relay
from pyproxy.backends.stale_conntrack import Filter
from pyproxy.backends.trace import AFFINITY_NOTE, RELAY, Outcome, Packet, Trace
from pyproxy.backends.userspace.table import (
    FILTER_CHAINS,
    NAT_CHAINS,
    UserspaceCache,
    UserspaceTable,
    listener,
    render_rules,
)
from pyproxy.backends.xtables.compare import compare as xtables_compare
from pyproxy.backends.xtables.rule import addrtype
from pyproxy.backends.xtables.rules import NEW, JumpRule
from pyproxy.backends.xtables.tables import cleanup_everywhere, ensure_jumps, open_tables
from pyproxy.backends.xtables.walk import Walker
from pyproxy.config.settings import ProxyConfig
from pyproxy.kernel.iptables import Iptables, IptablesError
from pyproxy.model.types import IPFamily, NamespacedName, Protocol, ProxyState

log = logging.getLogger(__name__)

LOCAL = addrtype("--dst-type")
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


_TO_PORTS = re.compile(r"--to-ports \d+")
RELAY_PORT = "--to-ports <relay port>"


def _no_conntrack(filters: Sequence[Filter], ipv6: bool) -> int:
    """The relay's flows to endpoints are its own sockets, not NAT: nothing to clear."""
    return 0


class UserspaceFamily:
    """IPv4's part of a sync (the engine's FamilyWriter): the relay's listeners, then the
    rules that lead to them. The rules are few (one per service address), so every write
    restores them whole; the relay changes only the listeners that differ."""

    family = IPFamily.IPV4

    def __init__(self, backend: UserspaceBackend, ipt: Iptables) -> None:
        self.ipt = ipt
        self.cache = UserspaceCache()
        self._backend = backend

    def before_partial(self, programmed: UserspaceTable, now: float) -> str:
        return ""

    def deferred_until(self) -> float | None:
        return None

    def write_full(self, new: UserspaceTable) -> None:
        self._write(new)
        declared = {("nat", c) for c in NAT_CHAINS} | {("filter", c) for c in FILTER_CHAINS}
        ensure_jumps(self.ipt, JUMPS, declared)

    def write_partial(
        self, programmed: UserspaceTable, updates: Mapping[NamespacedName, Entry[Any] | None]
    ) -> Callable[[], None]:
        if updates:
            self._write(programmed.with_updates(updates))
        return lambda: None

    def _write(self, table: UserspaceTable) -> None:
        ports = self._backend.relay.apply(table.specs())
        text = table.text(ports)
        try:
            with self._backend.transactions.applying(self.ipt.restore_label, text):
                self.ipt.restore(text)
        except IptablesError as err:
            raise BackendError(f"iptables-restore failed: {err}") from None
        if self._backend.listeners is not None:
            self._backend.listeners.set(len(ports))


class UserspaceBackend(Backend):
    mode = "userspace"

    def __init__(
        self,
        cfg: ProxyConfig,
        connect_timeout: float = 1.0,
        udp_idle_timeout: float = 30.0,
        max_connections: int = 1000,
        tables: Mapping[IPFamily, Iptables] | None = None,
    ) -> None:
        """``tables``: the xtables port (default: the back end the configuration chooses)."""
        self.proxy = cfg
        self._opts = (connect_timeout, udp_idle_timeout, max_connections)
        self._tables = tables
        self._engine: Engine[UserspaceTable] | None = None
        self._relay: Relay | None = None
        self._warned_sctp: set[str] = set()
        self.listeners: Gauge | None = None

    def register_metrics(self, registry: CollectorRegistry) -> None:
        self.listeners = Gauge(
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
            table = UserspaceCache().render(state)
            return (Walker(table.chains(None), JUMPS, local, "0x0"),
                    {listener(key): spec for key, spec in table.specs().items()})  # fmt: skip

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
        table = UserspaceCache().render(state)
        text = table.text(dict.fromkeys(table.specs(), 1))
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
        self._engine_set_up()

    def _engine_set_up(self) -> Engine[UserspaceTable]:
        """The IPv4 iptables the REDIRECT rules go to; BackendUnavailable when none can be
        written here (the daemon then ends at start, as the other modes do)."""
        if self._engine is None:
            tables = self._tables or open_tables(self.proxy.iptables_backend, (IPFamily.IPV4,),
                                                 self.mode)  # fmt: skip
            self._engine = Engine([UserspaceFamily(self, tables[IPFamily.IPV4])], _no_conntrack)
        return self._engine

    def sync(self, request: SyncRequest) -> SyncResult:
        engine = self._engine_set_up()
        for sp in request.state.services.values():
            if sp.protocol is Protocol.SCTP and str(sp.name) not in self._warned_sctp:
                self._warned_sctp.add(str(sp.name))
                log.warning("%s: SCTP is not supported in userspace mode; skipped", sp.name)
        return engine.sync(request.state, request)

    def cleanup(self) -> None:
        cleanup_everywhere(
            JUMPS, {"nat": NAT_CHAINS, "filter": FILTER_CHAINS}, families=(IPFamily.IPV4,)
        )

    def close(self) -> None:
        if self._relay is not None:
            self._relay.close()
