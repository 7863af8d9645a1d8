"""The backend interface: what every mode (iptables, ipvs, userspace, nftables) implements.

On each sync a backend's ``sync(request)`` receives a ``SyncRequest``:

- ``state``: the *full* current ``ProxyState`` (every service port, its endpoints, this node);
- ``changed``: the services (namespace/name) whose Service or EndpointSlices changed since the
  previous sync handed to this backend, so it may rewrite only their rules (a partial sync);
- ``full``: True when the backend must rewrite everything it owns (first sync, after a failed
  sync, after a node-label change, when ``drifted()`` said so, and at most once an hour
  otherwise, as upstream). A backend may always do more than asked, never less; with
  ``full`` False and nothing changed it should write nothing.

``sync`` returns a ``SyncResult`` (whether it did a full sync, which families it programmed,
time spent rendering and applying) or raises ``BackendError`` with a one-line, human-readable
reason; the caller then logs it, retries with backoff and asks for a full sync next. Rules
programmed by an earlier successful sync must stay in place when a sync fails.

``render(state)`` returns, as text, exactly what a full sync would program, and must not
touch the kernel: it backs ``pyproxy render`` and the rule tests.

``cleanup()`` removes everything the backend ever programmed and nothing else; it backs
``pyproxy cleanup`` and is called with no state, in a process of its own.

``drifted()`` is a cheap check, run on its own timer every sync period, that what the backend
programmed is still there (iptables modes: the canary chain); True asks for a full sync.

``register_metrics(registry)`` adds the metric families the mode owns (upstream registers
some only in some modes: iptables rule counts, nftables sync failures, ...) and the backend
keeps them current itself; the core metrics know no backend.

``close()`` releases in-process resources (sockets, threads) at shutdown without removing
rules, so a restart does not interrupt traffic.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from prometheus_client import CollectorRegistry

from pyproxy.backends.trace import Packet, Trace
from pyproxy.model.types import IPFamily, NamespacedName, ProxyState

W = TypeVar("W")


class BackendError(RuntimeError):
    """A sync or cleanup that did not take effect; the message is one line for the log."""


class BackendUnavailable(BackendError):
    """The mode cannot run on this host (missing tools or kernel features)."""


@dataclass(frozen=True)
class SyncRequest:
    state: ProxyState
    changed: frozenset[NamespacedName] = frozenset()
    full: bool = True
    reason: str = ""
    """Why ``full`` (the syncer's reason: "start", "periodic", "service CIDRs changed", ...)."""
    first_seen: float | None = None
    """When (monotonic) the oldest change in this sync reached the tracker: what a mode that
    reports "seen to programmed" measures from (None: nothing changed)."""


@dataclass(frozen=True)
class SyncResult:
    full: bool
    families: tuple[IPFamily, ...] = (IPFamily.IPV4,)
    """The IP families this sync programmed."""
    render_seconds: float = 0.0
    apply_seconds: float = 0.0
    no_local_endpoints: Mapping[tuple[str, IPFamily], int] = field(default_factory=dict)
    """Services with a Local policy and no local endpoint, by ("internal"|"external", family)."""
    sync_again_in: float | None = None
    """Seconds after which the backend has deferred work (None: none)."""
    reason: str = ""
    """Why it was full, when the backend decided so itself (a failed partial write, ...)."""


TEXT_KEPT = 256 * 1024
"""Bytes of a transaction's text kept for /debug/rules (a cold start at 10,000 services writes
tens of megabytes; the head says what it was)."""


@dataclass(frozen=True)
class Transaction:
    at: float
    """Wall-clock time it was applied (or failed)."""
    what: str
    """Which tool or kernel interface, and the IP family: "IPv4 iptables-restore"."""
    text: str
    size: int
    """The whole text's length (``text`` is its head)."""
    error: str = ""


class TransactionLog:
    """The last transaction a backend applied (per tool and family) and the last one that
    failed, with its error: what ``/debug/rules`` and SIGUSR1 show (upstream's users ask for
    the last programmed state, kubernetes/kubernetes#74677)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._applied: dict[str, Transaction] = {}
        self.failed: Transaction | None = None

    @contextlib.contextmanager
    def applying(self, what: str, text: str) -> Iterator[None]:
        """Record the transaction the block applies: as failed, with the error, when the block
        raises (which goes on), else as applied (an empty one is no transaction)."""
        try:
            yield
        except Exception as err:
            self.record(what, text, str(err))
            raise
        if text:
            self.record(what, text)

    def record(self, what: str, text: str, error: str = "") -> None:
        t = Transaction(time.time(), what, text[:TEXT_KEPT], len(text), error)
        with self._lock:
            if error:
                self.failed = t
            else:
                self._applied[what] = t

    @property
    def applied(self) -> list[Transaction]:
        """The last one applied through each tool and family (IPv4 and IPv6 are separate
        transactions), oldest first."""
        with self._lock:
            return sorted(self._applied.values(), key=lambda t: t.at)


@dataclass(frozen=True)
class Difference:
    """One of pyproxy's kernel objects that is not what it would program now (``pyproxy
    diff``): the lines expected and missing, and the lines present and not expected."""

    service: str
    """namespace/name, or "" for an object of the node's (a top-level chain, say)."""
    obj: str
    """The object, in the mode's terms: "nat chain KUBE-SVC-...", "ip map service-ips"."""
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()


def differences_doc(diffs: Sequence[Difference]) -> dict[str, Any]:
    """``pyproxy diff -o json`` and /debug/diff: whether they agree, and each difference."""
    return {"equal": not diffs, "differences": [dataclasses.asdict(d) for d in diffs]}


def ordered_changes(
    want: Sequence[str], have: Sequence[str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(missing, unexpected) lines of a list whose order counts (a chain's rules); the same
    lines in another order make all of both."""
    missing = tuple(x for x in want if x not in have)
    unexpected = tuple(x for x in have if x not in want)
    if not missing and not unexpected and list(want) != list(have):
        return tuple(want), tuple(have)
    return missing, unexpected


def per_service(
    obj: str, missing: Iterable[str], unexpected: Iterable[str], service_of: Callable[[str], str]
) -> list[Difference]:
    """Lines of one object that differ, as one Difference per service they belong to."""
    groups: dict[str, tuple[list[str], list[str]]] = {}
    for line in missing:
        groups.setdefault(service_of(line), ([], []))[0].append(line)
    for line in unexpected:
        groups.setdefault(service_of(line), ([], []))[1].append(line)
    return [Difference(svc, obj, tuple(m), tuple(u)) for svc, (m, u) in sorted(groups.items())]


@dataclass(frozen=True)
class ServiceTraffic:
    """What was counted for one service port since its objects were made. Each mode counts
    what it can see (README, "Per-service counters"): connections everywhere; packets and
    bytes as the mode's kernel objects count them (None: not counted in this mode)."""

    connections: int
    packets: int | None = None
    bytes: int | None = None

    def __add__(self, other: ServiceTraffic) -> ServiceTraffic:
        def plus(a: int | None, b: int | None) -> int | None:
            return None if a is None and b is None else (a or 0) + (b or 0)

        return ServiceTraffic(
            self.connections + other.connections,
            plus(self.packets, other.packets),
            plus(self.bytes, other.bytes),
        )


def by_service_port(counted: Iterable[tuple[str, ServiceTraffic]]) -> dict[str, ServiceTraffic]:
    """Sum what several objects (families, addresses, listeners) counted per service port."""
    out: dict[str, ServiceTraffic] = {}
    for name, seen in counted:
        out[name] = out[name] + seen if name in out else seen
    return out


class Backend(abc.ABC):
    mode: str = ""

    @functools.cached_property
    def transactions(self) -> TransactionLog:
        """This backend's transaction log (made on first use: backends have no common
        constructor)."""
        return TransactionLog()

    @abc.abstractmethod
    def sync(self, request: SyncRequest) -> SyncResult: ...

    @abc.abstractmethod
    def render(self, state: ProxyState) -> str: ...

    @abc.abstractmethod
    def cleanup(self) -> None: ...

    def drifted(self) -> bool:
        """True when someone else removed what this backend programmed."""
        return False

    def compare(self, state: ProxyState) -> list[Difference]:
        """pyproxy's own objects in this namespace's kernel against what it would program for
        ``state``, normalized (counters, handles, element order); [] when they agree."""
        raise BackendUnavailable(f"pyproxy diff does not support {self.mode} mode yet")

    def walker(
        self, state: ProxyState, family: IPFamily, make: Callable[[], W], kind: str = ""
    ) -> W:
        """The walk ``make`` builds for ``state`` (a render of every service), kept while the
        same state is traced again: ``explain`` traces each address of a port. ``kind`` keeps
        a mode's second walk (ebpf's socket map beside nftables' rules) apart from its first."""
        cache: dict[tuple[IPFamily, str], tuple[ProxyState, Any]] = self.__dict__.setdefault(
            "_walkers", {}
        )
        hit = cache.get((family, kind))
        if hit is None or hit[0] is not state:
            hit = cache[family, kind] = (state, make())
        return cast(W, hit[1])

    def forget_walks(self) -> None:
        """Drop the kept walk (a render of every service: tens of MB at 10,000 services)."""
        self.__dict__.pop("_walkers", None)

    def trace(self, state: ProxyState, packet: Packet) -> Trace:
        """Follow ``packet`` through the objects this mode renders for ``state`` (whose node
        carries this host's local addresses). Pure: reads the render, never the kernel."""
        raise BackendUnavailable(f"pyproxy trace does not support {self.mode} mode yet")

    def service_traffic(self) -> dict[str, ServiceTraffic]:
        """Per service port (``namespace/name[:port]``), both families summed: what this
        mode's objects counted. Reads the kernel (or the relay); for metrics and status."""
        raise BackendUnavailable(f"{self.mode} mode does not count traffic per service")

    def debug_state(self) -> dict[str, Any]:
        """What this mode adds to /debug/state (its own facts, for probes and tests)."""
        return {}

    def prepare(self) -> None:  # noqa: B027 - optional hook
        """Check, before any source starts, that the mode can work on this host: tools,
        kernel features, a working iptables or nftables back end. BackendUnavailable when no
        retry could fix it: the daemon then ends at once with that one line (status 1)."""

    def register_metrics(self, registry: CollectorRegistry) -> None:  # noqa: B027 - optional
        """Register the metric families this mode owns."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release in-process resources; rules stay programmed."""
