"""What ``trace`` and ``explain`` walk: the state with this network namespace's addresses (for
the rules' "is the address local" tests), and a pod address per family to trace from."""

from __future__ import annotations

from dataclasses import replace
from itertools import islice
from typing import cast

from pyproxy.backends.base import Backend
from pyproxy.config.settings import ProxyConfig
from pyproxy.kernel.addresses import local_addresses
from pyproxy.model.types import IPAddress, IPFamily, ProxyState
from pyproxy.tools.explain import Walk


def with_local_addresses(state: ProxyState) -> ProxyState:
    return replace(state, node=state.node.with_local_addresses(tuple(local_addresses())))


def walk_of(cfg: ProxyConfig, backend: Backend, state: ProxyState) -> Walk:
    """``state`` must carry the local addresses already (with_local_addresses)."""
    local = set(state.node.local_addresses)
    pods: dict[IPFamily, IPAddress] = {}
    for family in IPFamily:
        for cidr in cfg.local_cidrs(state.node, family)[:1]:
            # An address of the pod range that is not this node's own (a bridge's, say).
            free = (a for a in islice(cidr.hosts(), 16) if a not in local)
            if (ip := next(free, None)) is not None:
                pods[family] = cast(IPAddress, ip)
    return Walk(cfg.mode, lambda packet: backend.trace(state, packet), pods)
