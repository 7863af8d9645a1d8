"""This host's interface addresses, added to the state before a render (iptables and nftables
modes): NodePort CIDRs and ``primary`` select among them, as upstream's GetNodeIPs, and the
render itself stays pure."""

from __future__ import annotations

import logging
from dataclasses import replace

from pyproxy.config.settings import ProxyConfig
from pyproxy.kernel import addresses
from pyproxy.model.types import ProxyState

log = logging.getLogger(__name__)


def with_local_addresses(state: ProxyState, cfg: ProxyConfig) -> ProxyState:
    if not cfg.nodeport_addresses.needs_local_addresses:
        return state
    try:
        local = tuple(addresses.local_addresses())
    except Exception as err:  # netlink trouble must not stop the sync
        log.warning("cannot list local addresses: %s", err)
        return state
    return replace(state, node=state.node.with_local_addresses(local))
