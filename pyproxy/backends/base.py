"""The backend interface: what every mode (iptables, ipvs, userspace, nftables) implements.

On each sync a backend's ``sync(request)`` receives a ``SyncRequest``:

- ``state``: the *full* current ``ProxyState`` (every service port, its endpoints, this node);
- ``changed``: the services (namespace/name) whose Service or EndpointSlices changed since the
  previous sync handed to this backend, so it may rewrite only their rules (a partial sync);
- ``full``: True when the backend must rewrite everything it owns (first sync, after a failed
  sync, after a node-label change, and every sync period to repair drift). A backend may
  always do more than asked, never less.

``sync`` returns a ``SyncResult`` (whether it did a full sync and how many rules it owns and
wrote, for metrics) or raises ``BackendError`` with a one-line, human-readable reason; the
caller then logs it, retries with backoff and asks for a full sync next. Rules programmed by
an earlier successful sync must stay in place when a sync fails.

``render(state)`` returns, as text, exactly what a full sync would program, and must not
touch the kernel: it backs ``pyproxy render`` and the rule tests.

``cleanup()`` removes everything the backend ever programmed and nothing else; it backs
``pyproxy cleanup`` and is called with no state, in a process of its own.

``close()`` releases in-process resources (sockets, threads) at shutdown without removing
rules, so a restart does not interrupt traffic.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyproxy.model.types import NamespacedName, ProxyState


class BackendError(RuntimeError):
    """A sync or cleanup that did not take effect; the message is one line for the log."""


class BackendUnavailable(BackendError):
    """The mode cannot run on this host (missing tools or kernel features)."""


@dataclass(frozen=True)
class SyncRequest:
    state: ProxyState
    changed: frozenset[NamespacedName] = frozenset()
    full: bool = True


@dataclass(frozen=True)
class SyncResult:
    full: bool
    families: tuple[str, ...] = ("IPv4",)
    """The IP families this sync programmed ("IPv4", "IPv6")."""
    rules_total: Mapping[str, int] = field(default_factory=dict)
    """Rules the backend owns after the sync, keyed "table/family"."""
    rules_written: Mapping[str, int] = field(default_factory=dict)
    """Rules written in this sync, keyed "table/family"."""
    render_seconds: float = 0.0
    apply_seconds: float = 0.0
    no_local_endpoints: Mapping[str, int] = field(default_factory=dict)
    """Services with a Local policy and no local endpoint, keyed "internal|external/family"."""
    restore_failures: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """Cumulative (failed restores, failed partial restores) per family."""


class Backend(abc.ABC):
    mode: str = ""

    @abc.abstractmethod
    def sync(self, request: SyncRequest) -> SyncResult: ...

    @abc.abstractmethod
    def render(self, state: ProxyState) -> str: ...

    @abc.abstractmethod
    def cleanup(self) -> None: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release in-process resources; rules stay programmed."""
