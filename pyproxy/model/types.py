"""Immutable value objects for the proxy state.

These mirror upstream kube-proxy's ``ServicePortName``, ``ServicePort`` and ``Endpoint``
(pkg/proxy). Both IP families live in one ``ServicePort``; a backend picks its family with
``for_family`` so the same state drives IPv4 and IPv6 rules.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_STICKY_SECONDS = 10800
ZONE_LABEL = "topology.kubernetes.io/zone"
TO_BE_DELETED_TAINT = "ToBeDeletedByClusterAutoscaler"


class Protocol(StrEnum):
    TCP = "TCP"
    UDP = "UDP"
    SCTP = "SCTP"


class IPFamily(StrEnum):
    IPV4 = "IPv4"
    IPV6 = "IPv6"

    @staticmethod
    def of(addr: IPAddress | IPNetwork) -> IPFamily:
        return IPFamily.IPV4 if addr.version == 4 else IPFamily.IPV6


class TrafficPolicy(StrEnum):
    CLUSTER = "Cluster"
    LOCAL = "Local"


@dataclass(frozen=True, order=True)
class NamespacedName:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, order=True)
class ServicePortName:
    """The key of everything: namespace/name:port-name plus protocol (as upstream)."""

    service: NamespacedName
    port: str
    protocol: Protocol

    def __str__(self) -> str:
        # Upstream's ServicePortName.String(): the ":port" part is omitted for unnamed ports.
        base = str(self.service)
        return f"{base}:{self.port}" if self.port else base


@dataclass(frozen=True)
class ServicePort:
    """One port of one Service, with everything that decides its rules."""

    name: ServicePortName
    cluster_ips: tuple[IPAddress, ...]
    port: int
    node_port: int = 0
    external_ips: tuple[IPAddress, ...] = ()
    load_balancer_ips: tuple[IPAddress, ...] = ()
    load_balancer_source_ranges: tuple[IPNetwork, ...] = ()
    session_affinity_client_ip: bool = False
    sticky_max_age_seconds: int = DEFAULT_STICKY_SECONDS
    external_policy_local: bool = False
    internal_policy_local: bool = False
    health_check_node_port: int = 0
    traffic_distribution: str = ""

    @property
    def protocol(self) -> Protocol:
        return self.name.protocol

    @property
    def externally_accessible(self) -> bool:
        return self.node_port != 0 or bool(self.load_balancer_ips) or bool(self.external_ips)

    @property
    def uses_cluster_endpoints(self) -> bool:
        # Upstream: !InternalPolicyLocal || (ExternallyAccessible && !ExternalPolicyLocal).
        return not self.internal_policy_local or (
            self.externally_accessible and not self.external_policy_local
        )

    @property
    def uses_local_endpoints(self) -> bool:
        return self.internal_policy_local or (
            self.externally_accessible and self.external_policy_local
        )

    def cluster_ip(self, family: IPFamily) -> IPAddress | None:
        for ip in self.cluster_ips:
            if IPFamily.of(ip) is family:
                return ip
        return None

    def for_family(self, family: IPFamily) -> ServicePort | None:
        """The view of this port for one IP family, or None when it has no IP there."""
        if self.cluster_ip(family) is None:
            return None

        def keep(items: tuple[IPAddress, ...]) -> tuple[IPAddress, ...]:
            return tuple(i for i in items if IPFamily.of(i) is family)

        return replace(
            self,
            cluster_ips=keep(self.cluster_ips),
            external_ips=keep(self.external_ips),
            load_balancer_ips=keep(self.load_balancer_ips),
            load_balancer_source_ranges=tuple(
                n for n in self.load_balancer_source_ranges if IPFamily.of(n) is family
            ),
        )


@dataclass(frozen=True, order=True, slots=True)
class Endpoint:
    """One backend address of a service port, from an EndpointSlice. Slotted: a node holds
    one per endpoint and port (200,000 at 10,000 services x 10 endpoints)."""

    ip: IPAddress
    port: int
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    node_name: str = ""
    zone: str = ""
    zone_hints: frozenset[str] = field(default_factory=frozenset)
    node_hints: frozenset[str] = field(default_factory=frozenset)

    @property
    def family(self) -> IPFamily:
        return IPFamily.of(self.ip)

    def __str__(self) -> str:
        return self.hostport

    def with_port(self, port: int) -> Endpoint:
        """This endpoint on ``port`` (dataclasses.replace, without its per-call cost: one
        call per endpoint and port of every slice at start)."""
        return Endpoint(self.ip, port, self.ready, self.serving, self.terminating,
                        self.node_name, self.zone, self.zone_hints, self.node_hints)  # fmt: skip

    @property
    def hostport(self) -> str:
        """net.JoinHostPort form, which is also what upstream hashes into SEP chain names."""
        host = f"[{self.ip}]" if self.ip.version == 6 else str(self.ip)
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class NodeInfo:
    """What the proxy needs to know about its own node.

    ``addresses`` and ``pod_cidrs`` come from the Node object (a source); ``local_addresses``
    are this host's interface addresses, which only the kernel layer knows: a backend adds
    them to the state before it renders, so rendering itself never asks the kernel.
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    deleting: bool = False
    tainted_for_deletion: bool = False
    exists: bool = True
    addresses: tuple[IPAddress, ...] = ()
    """``status.addresses``: InternalIPs first, then ExternalIPs, as upstream orders them."""
    pod_cidrs: tuple[IPNetwork, ...] = ()
    local_addresses: tuple[IPAddress, ...] = ()

    @property
    def zone(self) -> str:
        return self.labels.get(ZONE_LABEL, "")

    @property
    def eligible(self) -> bool:
        """Upstream's /healthz node eligibility: not being deleted nor drained by the autoscaler."""
        return not self.deleting and not self.tainted_for_deletion

    def primary_ip(self, family: IPFamily) -> IPAddress | None:
        """The node's IP of ``family`` (upstream's GetNodeHostIPs: first InternalIP, else
        first ExternalIP), or None when the Node object names none."""
        return next((ip for ip in self.addresses if IPFamily.of(ip) is family), None)

    def pod_cidr(self, family: IPFamily) -> IPNetwork | None:
        return next((c for c in self.pod_cidrs if IPFamily.of(c) is family), None)

    def with_local_addresses(self, addresses: tuple[IPAddress, ...]) -> NodeInfo:
        return replace(self, local_addresses=addresses)


@dataclass(frozen=True)
class ProxyState:
    """The full state a backend renders: every service port and its endpoints.

    ``by_service`` indexes the ports of each service; the change tracker keeps it current so a
    partial sync finds a changed service's ports without scanning the others. States built by
    hand may leave it out: it is then derived once, on first use.
    """

    services: Mapping[ServicePortName, ServicePort]
    endpoints: Mapping[ServicePortName, tuple[Endpoint, ...]]
    node: NodeInfo
    by_service: Mapping[NamespacedName, tuple[ServicePortName, ...]] | None = None
    service_cidrs: tuple[IPNetwork, ...] = ()
    """The cluster's service IP ranges (ServiceCIDR objects), for dropping traffic to
    unallocated cluster IPs."""

    def endpoints_for(self, name: ServicePortName, family: IPFamily) -> tuple[Endpoint, ...]:
        return tuple(e for e in self.endpoints.get(name, ()) if e.family is family)

    @cached_property
    def _index(self) -> Mapping[NamespacedName, tuple[ServicePortName, ...]]:
        if self.by_service is not None:
            return self.by_service
        index: dict[NamespacedName, list[ServicePortName]] = {}
        for spn in self.services:
            index.setdefault(spn.service, []).append(spn)
        return {k: tuple(v) for k, v in index.items()}

    def service_addresses(self) -> frozenset[IPAddress]:
        """Every cluster, external and load-balancer IP: addresses that are no node's."""
        return frozenset(
            ip
            for sp in self.services.values()
            for ip in (*sp.cluster_ips, *sp.external_ips, *sp.load_balancer_ips)
        )

    def service_names(self) -> list[NamespacedName]:
        return sorted(self._index)

    def service_ports(self, service: NamespacedName) -> list[ServicePort]:
        """One service's ports (both families), in a stable order."""
        names = sorted(self._index.get(service, ()), key=lambda k: (k.port, k.protocol.value))
        return [self.services[spn] for spn in names]

    def ports_of(self, service: NamespacedName, family: IPFamily) -> list[ServicePort]:
        """The family views of one service's ports, in a stable order."""
        views = (sp.for_family(family) for sp in self.service_ports(service))
        return [v for v in views if v is not None]

    def sorted_services(self, family: IPFamily) -> list[ServicePort]:
        """Service ports with an address in ``family``, in a stable order for rendering."""
        return [sp for svc in self.service_names() for sp in self.ports_of(svc, family)]
