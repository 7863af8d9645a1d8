"""Endpoint selection: the one place that decides which endpoints a service port uses.

Traffic policies, topology hints and the terminating-endpoint fallback all live here (as in
upstream's ``CategorizeEndpoints``, pkg/proxy/topology.go), so every backend and the
``explain`` tooling agree on the answer, and the answer carries the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pyproxy.model.types import Endpoint, NodeInfo, ServicePort

PREFER_SAME_ZONE = "PreferSameZone"
PREFER_SAME_NODE = "PreferSameNode"


@dataclass(frozen=True)
class EndpointSelection:
    cluster: tuple[Endpoint, ...]
    """Endpoints for Cluster traffic policy (empty when the policy is not used)."""
    local: tuple[Endpoint, ...]
    """Endpoints on this node for Local traffic policy (empty when not used)."""
    all_reachable: tuple[Endpoint, ...]
    """Union of the two: every endpoint that needs per-endpoint rules on this node."""
    has_any: bool
    """True when the service has usable endpoints anywhere, not only on this node."""
    topology_mode: str = ""
    """Which hints narrowed ``cluster`` ("" when none did)."""
    internal_local: bool = False
    """Traffic to the cluster IP keeps to this node (internalTrafficPolicy: Local)."""
    external_local: bool = False
    """Traffic from outside keeps to this node (externalTrafficPolicy: Local)."""

    @property
    def internal(self) -> tuple[Endpoint, ...]:
        """The endpoints traffic to the cluster IP goes to."""
        return self.local if self.internal_local else self.cluster

    @property
    def external(self) -> tuple[Endpoint, ...]:
        """The endpoints traffic from outside (NodePort, external and LB IPs) goes to."""
        return self.local if self.external_local else self.cluster

    @property
    def has_internal(self) -> bool:
        """Traffic to the cluster IP has somewhere to go here (else: refused, or dropped
        when a Local policy has no endpoint on this node)."""
        return self.has_any and (not self.internal_local or bool(self.local))

    @property
    def has_external(self) -> bool:
        return self.has_any and (not self.external_local or bool(self.local))


def _is_local(ep: Endpoint, node: NodeInfo) -> bool:
    return bool(ep.node_name) and ep.node_name == node.name


def _topology_mode(svc: ServicePort, endpoints: Iterable[Endpoint], node: NodeInfo) -> str:
    """Hints are used only when every ready endpoint carries them and one matches us."""
    has_for_node = False
    all_node_hints = True
    has_for_zone = False
    all_zone_hints = True
    for ep in endpoints:
        if not ep.ready:
            continue
        if not ep.node_hints:
            all_node_hints = False
        elif node.name in ep.node_hints:
            has_for_node = True
        if not ep.zone_hints:
            all_zone_hints = False
        elif node.zone in ep.zone_hints:
            has_for_zone = True
    if svc.traffic_distribution == PREFER_SAME_NODE and all_node_hints and has_for_node:
        return PREFER_SAME_NODE
    if all_zone_hints and has_for_zone and node.zone:
        return PREFER_SAME_ZONE
    return ""


def _available(ep: Endpoint, mode: str, node: NodeInfo) -> bool:
    if mode == PREFER_SAME_NODE:
        return node.name in ep.node_hints
    if mode == PREFER_SAME_ZONE:
        return node.zone in ep.zone_hints
    return True


def _pick(endpoints: Iterable[Endpoint], keep: Callable[[Endpoint], bool]) -> tuple[Endpoint, ...]:
    return tuple(ep for ep in endpoints if keep(ep))


def categorize_endpoints(
    svc: ServicePort, endpoints: Iterable[Endpoint], node: NodeInfo
) -> EndpointSelection:
    """Split ``endpoints`` of ``svc`` into the sets its traffic policies use on ``node``."""
    eps = tuple(endpoints)
    policies = (svc.internal_policy_local, svc.external_policy_local)
    cluster: tuple[Endpoint, ...] = ()
    local: tuple[Endpoint, ...] = ()
    has_any = False
    mode = ""

    if svc.uses_cluster_endpoints:
        mode = _topology_mode(svc, eps, node)
        cluster = _pick(eps, lambda e: e.ready and _available(e, mode, node))
        if not cluster:
            # No ready endpoint anywhere: fall back to serving-but-terminating ones.
            cluster = _pick(
                eps, lambda e: e.serving and e.terminating and _available(e, mode, node)
            )
        has_any = bool(cluster)

    if not svc.uses_local_endpoints:
        return EndpointSelection(cluster, (), cluster, has_any, mode, *policies)

    local_ready = False
    local_terminating = False
    for ep in eps:
        if ep.ready:
            has_any = True
            local_ready = local_ready or _is_local(ep, node)
        elif ep.serving and ep.terminating:
            has_any = True
            local_terminating = local_terminating or _is_local(ep, node)
    if local_ready:
        local = _pick(eps, lambda e: _is_local(e, node) and e.ready)
    elif local_terminating:
        local = _pick(eps, lambda e: _is_local(e, node) and e.serving and e.terminating)

    if not svc.uses_cluster_endpoints:
        return EndpointSelection((), local, local, has_any, mode, *policies)

    seen = set(cluster)
    union = cluster + tuple(e for e in local if e not in seen)
    return EndpointSelection(cluster, local, union, has_any, mode, *policies)
