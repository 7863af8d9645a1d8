"""Localhost NodePorts in nftables mode (upstream v1.37's localnodeportproxy, KEP-6032).

nftables has no ``route_localnet`` way to DNAT 127.0.0.1, so when ``--nodeport-addresses``
names loopback, each TCP NodePort with endpoints gets a listener on 127.0.0.1 (IPv4) or ::1
(IPv6) on the NodePort itself, relaying to the endpoints the external traffic policy allows
(ClientIP affinity pins, as every local client is the same address). UDP and SCTP are
rejected and counted by the table instead (``static``). Kept per service, so a partial sync
looks only at the changed services.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from pyproxy.backends.relay import PortSpec, Relay
from pyproxy.model.selection import categorize_endpoints
from pyproxy.model.types import IPFamily, NamespacedName, Protocol, ProxyState

log = logging.getLogger(__name__)

LOOPBACK = {IPFamily.IPV4: "127.0.0.1", IPFamily.IPV6: "::1"}


def service_listeners(
    state: ProxyState, svc: NamespacedName, family: IPFamily
) -> dict[str, PortSpec]:
    """The listeners one service needs in ``family`` (pure): key ``IPv4/tcp/30080``."""
    out: dict[str, PortSpec] = {}
    for sp in state.ports_of(svc, family):
        if not sp.node_port or sp.protocol is not Protocol.TCP:
            continue
        sel = categorize_endpoints(sp, state.endpoints_for(sp.name, family), state.node)
        eps = sel.local if sp.external_policy_local else sel.cluster
        if not eps:
            continue  # nothing listens: the kernel refuses the connection
        out[f"{family.value}/tcp/{sp.node_port}"] = PortSpec(
            "tcp",
            tuple((str(e.ip), e.port) for e in eps),
            sp.sticky_max_age_seconds if sp.session_affinity_client_ip else 0,
            str(sp.name),
            host=LOOPBACK[family],
            port=sp.node_port,
        )
    return out


class LocalhostNodePorts:
    """The listeners of the families that serve loopback, reconciled after each sync."""

    def __init__(self, families: Iterable[IPFamily]) -> None:
        self.families = tuple(families)
        self._wanted: dict[NamespacedName, dict[str, PortSpec]] = {}
        self._relay: Relay | None = None

    def update(self, state: ProxyState, changed: Iterable[NamespacedName] | None) -> None:
        """Recompute the changed services' listeners (every service's when ``changed`` is
        None) and change only what differs; listeners that could not bind are retried."""
        if not self.families:
            return
        if changed is None:
            present = state.service_names()
            changed = [*present, *(set(self._wanted) - set(present))]
        removed: set[str] = set()
        added: dict[str, PortSpec | None] = {}
        for svc in changed:
            new: dict[str, PortSpec] = {}
            for family in self.families:
                new.update(service_listeners(state, svc, family))
            old = self._wanted.pop(svc, {})
            removed.update(k for k in old if k not in new)
            added.update({k: v for k, v in new.items() if old.get(k) != v})
            if new:
                self._wanted[svc] = new
        for key in self.failed:  # another program may have let go of the port since
            spec = self._spec(key)
            if spec is not None:
                added.setdefault(key, spec)
        delta = {k: None for k in removed if k not in added} | added
        if not delta:
            return
        if self._relay is None:
            self._relay = Relay(connect_timeout=5.0)
        self._relay.change(delta)
        for key, why in self._relay.failed.items():
            if key in delta:
                log.error("localhost NodePort %s: %s", key, why)

    def _spec(self, key: str) -> PortSpec | None:
        return next((per[key] for per in self._wanted.values() if key in per), None)

    @property
    def failed(self) -> dict[str, str]:
        return self._relay.failed if self._relay is not None else {}

    def listening(self, family: IPFamily) -> int:
        ports = self._relay.ports() if self._relay is not None else {}
        return sum(1 for key in ports if key.startswith(f"{family.value}/"))

    def close(self) -> None:
        if self._relay is not None:
            self._relay.close()
            self._relay = None
