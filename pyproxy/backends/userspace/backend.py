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
import time
from collections.abc import Mapping

from pyproxy.backends.base import Backend, BackendError, BackendUnavailable, SyncRequest, SyncResult
from pyproxy.backends.userspace.relay import PortSpec, Relay
from pyproxy.kernel.iptables import (
    Iptables,
    IptablesError,
    chains_in_save,
    detect_backend,
    remove_chains,
    working_tables,
)
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
NEW = ("-m", "conntrack", "--ctstate", "NEW")
LOCAL = ("-m", "addrtype", "--dst-type", "LOCAL")
# (table, from, to, match, comment), in the order they must end up (each is prepended)
JUMPS: tuple[tuple[str, str, str, tuple[str, ...], str], ...] = (
    (
        "nat",
        "PREROUTING",
        "KUBE-PORTALS-CONTAINER",
        (),
        "handle ClusterIPs; NOTE: this must be before the NodePort rules",
    ),
    (
        "nat",
        "OUTPUT",
        "KUBE-PORTALS-HOST",
        (),
        "handle ClusterIPs; NOTE: this must be before the NodePort rules",
    ),
    (
        "nat",
        "PREROUTING",
        "KUBE-NODEPORT-CONTAINER",
        LOCAL,
        "handle service NodePorts; NOTE: this must be the last rule in the chain",
    ),
    (
        "nat",
        "OUTPUT",
        "KUBE-NODEPORT-HOST",
        LOCAL,
        "handle service NodePorts; NOTE: this must be the last rule in the chain",
    ),
    ("filter", "FORWARD", "KUBE-SERVICES", NEW, "kubernetes service portals"),
    ("filter", "OUTPUT", "KUBE-SERVICES", NEW, "kubernetes service portals"),
    (
        "filter",
        "INPUT",
        "KUBE-EXTERNAL-SERVICES",
        NEW,
        "kubernetes externally-visible service portals",
    ),
)


def _args(jump: tuple[str, str, str, tuple[str, ...], str]) -> list[str]:
    return [*jump[3], "-m", "comment", "--comment", jump[4], "-j", jump[2]]


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


def render_rules(state: ProxyState, ports: Mapping[str, int] | None) -> str:
    """nat + filter rules; ``ports`` maps listener keys to local ports (None: placeholders)."""
    nat = ["*nat", *(f":{c} - [0:0]" for c in NAT_CHAINS)]
    filt = ["*filter", *(f":{c} - [0:0]" for c in FILTER_CHAINS)]
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
        has = key in (ports if ports is not None else specs(state))
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
        to = str(ports[key]) if ports is not None else f"<port of {key}>"
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
        iptables_backend: str = "auto",
        connect_timeout: float = 1.0,
        udp_idle_timeout: float = 30.0,
        max_connections: int = 1000,
    ) -> None:
        self._backend_name = iptables_backend
        self._opts = (connect_timeout, udp_idle_timeout, max_connections)
        self._ipt: Iptables | None = None
        self._relay: Relay | None = None
        self._warned_sctp: set[str] = set()

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

    def sync(self, request: SyncRequest) -> SyncResult:
        t0 = time.monotonic()
        if self._ipt is None:
            try:
                self._ipt = Iptables(detect_backend(self._backend_name))
            except IptablesError as err:
                raise BackendUnavailable(str(err)) from None
        for sp in request.state.services.values():
            if sp.protocol is Protocol.SCTP and str(sp.name) not in self._warned_sctp:
                self._warned_sctp.add(str(sp.name))
                log.warning("%s: SCTP is not supported in userspace mode; skipped", sp.name)
        wanted = specs(request.state)
        ports = self.relay.apply(wanted)
        text = render_rules(request.state, ports)
        t1 = time.monotonic()
        try:
            if request.full:
                for jump in reversed(JUMPS):
                    self._ipt.ensure_chain(jump[0], jump[2])
                    self._ipt.ensure_rule_first(jump[0], jump[1], _args(jump))
            self._ipt.restore(text)
        except IptablesError as err:
            raise BackendError(f"iptables-restore failed: {err}") from None
        lines = sum(1 for line in text.splitlines() if line.startswith("-A"))
        return SyncResult(
            full=True,
            families=("IPv4",),
            rules_total={"nat/IPv4": lines},
            rules_written={"nat/IPv4": lines},
            render_seconds=t1 - t0,
            apply_seconds=time.monotonic() - t1,
        )

    def cleanup(self) -> None:
        errors = []
        for ipt in working_tables():
            if ipt.ipv6:
                continue
            try:
                for jump in JUMPS:
                    ipt.delete_rule(jump[0], jump[1], _args(jump))
                for table, chains in (("nat", NAT_CHAINS), ("filter", FILTER_CHAINS)):
                    present = chains_in_save(ipt.save(table))
                    remove_chains(ipt, table, [c for c in chains if c in present])
            except IptablesError as err:
                errors.append(f"{ipt.backend}: {err}")
        if errors:
            raise BackendError("; ".join(errors))

    def close(self) -> None:
        if self._relay is not None:
            self._relay.close()
