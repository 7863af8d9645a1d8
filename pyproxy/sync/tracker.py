"""Change tracker: turns object events into the proxy state plus what changed since the last sync.

Semantics follow upstream's ServiceChangeTracker / EndpointsChangeTracker: a change is judged
against the state the last sync consumed (each pending change remembers that value), so
add-then-delete of one object, or an update that changes nothing the proxy uses, leaves
nothing pending. ``take()`` hands a sync the state, the services whose rules changed (for
partial syncs) and the timing data for latency metrics.

The state's service ports and endpoints live in persistent maps (``immutables.Map``, a
hash array mapped trie): an event updates them in O(log n) and ``take()`` hands out a snapshot
in O(1), so the cost of a sync's bookkeeping follows what changed, not the cluster's size.

Thread-safe: sources call ``apply`` from their threads; the runner calls ``take``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from immutables import Map

from pyproxy.model import convert
from pyproxy.model.events import KINDS, Event, EventType
from pyproxy.model.types import (
    Endpoint,
    IPNetwork,
    NamespacedName,
    NodeInfo,
    ProxyState,
    ServicePort,
    ServicePortName,
)

log = logging.getLogger(__name__)

SKIPPED_KEPT = 200

SliceKey = tuple[NamespacedName, str]  # (service, slice name)
EndpointsOfService = dict[ServicePortName, tuple[Endpoint, ...]]


@dataclass(frozen=True)
class Changes:
    """What one sync receives from the tracker."""

    state: ProxyState
    changed_services: frozenset[NamespacedName]
    """Services whose Service object or endpoints differ from the last sync."""
    service_changes: int
    endpoint_changes: int
    full_reason: str
    """Why a full sync is due ("node labels changed", "service CIDRs changed", both joined
    by a comma), or "" when a partial sync will do."""
    trigger_times: Mapping[NamespacedName, tuple[float, ...]] = field(default_factory=dict)
    """EndpointSlice last-change-trigger-time (wall clock) per changed service."""
    first_seen: float | None = None
    """Monotonic time the oldest change in this batch was seen (None if nothing changed)."""
    first_seen_wall: float | None = None
    """The same, in wall-clock time (health: how long a change has waited)."""
    generation: int = 0
    """How many changes the tracker had applied when this was taken: once a sync of this
    succeeded, everything observed up to it is programmed (``/debug/state``)."""


def _merge_endpoints(slices: Sequence[convert.SliceInfo]) -> EndpointsOfService:
    merged: dict[ServicePortName, dict[str, Endpoint]] = {}
    for sl in slices:
        for pname, proto, number in sl.ports:
            spn = ServicePortName(sl.service, pname, proto)
            bucket = merged.setdefault(spn, {})
            for ep in sl.endpoints:
                real = ep.with_port(number)
                key = str(real)
                old = bucket.get(key)
                if old is None or (real.ready and not old.ready):
                    bucket[key] = real
    return {spn: tuple(b[k] for k in sorted(b)) for spn, b in merged.items()}


class ChangeTracker:
    def __init__(
        self,
        node_name: str,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._wall = wall
        self.node_name = node_name
        self._services: dict[NamespacedName, tuple[ServicePort, ...]] = {}
        self._slices: dict[NamespacedName, dict[str, convert.SliceInfo]] = {}
        self._endpoints: dict[NamespacedName, EndpointsOfService] = {}
        self._slice_keys: dict[NamespacedName, SliceKey] = {}  # slice object -> key
        self._ports: Map[ServicePortName, ServicePort] = Map()
        self._eps: Map[ServicePortName, tuple[Endpoint, ...]] = Map()
        self._by_service: Map[NamespacedName, tuple[ServicePortName, ...]] = Map()
        self._node = NodeInfo(name=node_name, exists=False)
        self._service_cidrs: dict[str, tuple[IPNetwork, ...]] = {}
        self._synced_node_labels: Mapping[str, str] = {}
        # pending change -> the value the last sync saw
        self._pending_services: dict[NamespacedName, tuple[ServicePort, ...] | None] = {}
        self._pending_endpoints: dict[NamespacedName, EndpointsOfService] = {}
        self._trigger_times: dict[NamespacedName, list[float]] = {}
        self._first_seen: float | None = None
        self._first_seen_wall: float | None = None
        self.last_queued: float | None = None
        """Wall-clock time of the latest change that needs a sync (a metric upstream has)."""
        self._cidrs_changed = False
        self._synced_kinds: set[str] = set()
        self.generation = 0
        """Changes applied so far (an event that changed something the proxy uses)."""
        self._warned_orphans: set[NamespacedName] = set()
        self.skipped: Counter[str] = Counter()
        self.skipped_recent: deque[tuple[str, str, str]] = deque(maxlen=SKIPPED_KEPT)
        """(kind, namespace/name, reason) of the latest skipped objects, for /debug/state."""
        self.on_change: Callable[[], None] | None = None
        self._handlers: dict[str, Callable[[Mapping[str, Any], bool], bool]] = {
            "Service": self._on_service,
            "EndpointSlice": self._on_slice,
            "Node": self._on_node,
            "ServiceCIDR": self._on_service_cidr,
        }

    # ---- input side -------------------------------------------------------------------

    @property
    def initialized(self) -> bool:
        """Upstream syncs only once Services and EndpointSlices have been listed, and knows its
        Node first (its addresses and labels shape every rule). Waiting for every kind's first
        list avoids a full sync of a large cluster followed at once by another because the
        Node arrived a moment later (measured: 26 s twice at 10,000 services)."""
        with self._lock:
            return set(KINDS) <= self._synced_kinds

    def apply(self, event: Event) -> bool:
        """Apply one event; returns True when something the proxy uses changed."""
        with self._lock:
            changed = self._apply_locked(event)
            self.generation += changed
        if changed and self.on_change is not None:
            self.on_change()
        return changed

    def _apply_locked(self, event: Event) -> bool:
        if event.type is EventType.SYNCED:
            first = event.kind not in self._synced_kinds
            self._synced_kinds.add(event.kind)
            return first
        if event.type is EventType.REPLACE:
            return self._replace_locked(event.kind, event.objects)
        deleted = event.type is EventType.DELETED
        handler = self._handlers.get(event.kind)
        if handler is None:
            log.warning("ignoring event for unknown kind %r", event.kind)
            return False
        try:
            return handler(event.obj, deleted)
        except (TypeError, AttributeError, KeyError, IndexError, ValueError) as err:
            # A field of a type the conversion does not expect (found by generated objects,
            # tests/unit/test_bad_objects.py). Conversion runs before any state changes, so
            # skipping the object leaves the state as it was.
            ref = convert.object_ref(event.obj) if isinstance(event.obj, Mapping) else "?"
            self._skip(convert.BadObject(event.kind, ref, f"malformed ({type(err).__name__})"))
            return False

    def _replace_locked(self, kind: str, objects: Sequence[Mapping[str, Any]]) -> bool:
        changed = False
        keys = set()
        for obj in objects:
            try:
                keys.add(convert.object_key(obj, kind))
            except convert.BadObject:
                pass
        if kind == "Service":
            for key in list(self._services):
                if key not in keys:
                    changed |= self._set_service(key, None)
        elif kind == "EndpointSlice":
            for key in list(self._slice_keys):
                if key not in keys:
                    changed |= self._drop_slice(key)
        elif kind == "ServiceCIDR":
            for name in [n for n in self._service_cidrs if NamespacedName("", n) not in keys]:
                changed |= self._on_service_cidr({"metadata": {"name": name}}, True)
        elif kind == "Node" and self.node_name not in {k.name for k in keys}:
            changed |= self._on_node({"metadata": {"name": self.node_name}}, True)
        for obj in objects:
            changed |= self._apply_locked(Event(kind, EventType.MODIFIED, obj))
        return changed

    def _skip(self, err: convert.BadObject) -> None:
        self.skipped[err.kind] += 1
        self.skipped_recent.append((err.kind, err.ref, err.reason))
        log.error("skipping %s", err)

    def _on_service(self, obj: Mapping[str, Any], deleted: bool) -> bool:
        try:
            key = convert.object_key(obj, "Service")
            if deleted or convert.is_ignored_by_label(obj):
                ports: tuple[ServicePort, ...] | None = None
            else:
                ports = convert.service_ports(obj)
        except convert.BadObject as err:
            self._skip(err)
            return False  # keep whatever we had: a bad update never drops working rules
        return self._set_service(key, ports or None)

    def _set_service(self, key: NamespacedName, ports: tuple[ServicePort, ...] | None) -> bool:
        before = self._services.get(key)
        if before == ports:
            return False
        with self._ports.mutate() as m:
            for sp in before or ():
                del m[sp.name]
            for sp in ports or ():
                m[sp.name] = sp
            self._ports = m.finish()
        if ports is None:
            self._services.pop(key, None)
            self._by_service = self._by_service.delete(key)
        else:
            self._services[key] = ports
            self._by_service = self._by_service.set(key, tuple(sp.name for sp in ports))
            self._warned_orphans.discard(key)
        self._mark(self._pending_services, key, before, ports)
        return True

    def _mark(
        self, pending: dict[NamespacedName, Any], key: NamespacedName, before: Any, after: Any
    ) -> None:
        """Record that ``key`` changed from ``before``; forget it once it is back to what
        the last sync saw."""
        synced = pending.setdefault(key, before)
        if after == synced:
            del pending[key]
        else:
            self._seen_now()

    def _seen_now(self) -> None:
        """A change that needs a sync was seen: note when (the first one since the last
        sync, for latency and health; the latest, for the queued-timestamp metric)."""
        self.last_queued = self._wall()
        if self._first_seen is None:
            self._first_seen = self._clock()
            self._first_seen_wall = self.last_queued

    def pending_since(self) -> float | None:
        """Wall-clock time of the oldest change no sync has taken yet (None: none)."""
        with self._lock:
            return self._first_seen_wall if self._pending_any() else None

    def _on_slice(self, obj: Mapping[str, Any], deleted: bool) -> bool:
        try:
            obj_key = convert.object_key(obj, "EndpointSlice")
            if deleted or convert.is_ignored_by_label(obj):
                return self._drop_slice(obj_key)
            info = convert.endpoint_slice(obj)
        except convert.BadObject as err:
            self._skip(err)
            return False
        if info is None:
            return self._drop_slice(obj_key)
        key: SliceKey = (info.service, obj_key.name)
        old_key = self._slice_keys.get(obj_key)
        changed = False
        if old_key is not None and old_key != key:  # relabelled to another service
            changed |= self._drop_slice(obj_key)
        before = self._endpoints.get(info.service, {})
        self._slices.setdefault(info.service, {})[obj_key.name] = info
        self._slice_keys[obj_key] = key
        if info.trigger_time is not None:
            self._trigger_times.setdefault(info.service, []).append(info.trigger_time)
        return self._after_slice_change(info.service, before) or changed

    def _drop_slice(self, obj_key: NamespacedName) -> bool:
        key = self._slice_keys.pop(obj_key, None)
        if key is None:
            return False
        svc, name = key
        before = self._endpoints.get(svc, {})
        slices = self._slices.get(svc, {})
        slices.pop(name, None)
        if not slices:
            self._slices.pop(svc, None)
        return self._after_slice_change(svc, before)

    def _after_slice_change(self, svc: NamespacedName, before: EndpointsOfService) -> bool:
        after = _merge_endpoints([s for _, s in sorted(self._slices.get(svc, {}).items())])
        if after == before:
            return False
        with self._eps.mutate() as m:
            for spn in before:
                del m[spn]
            for spn, eps in after.items():
                m[spn] = eps
            self._eps = m.finish()
        if after:
            self._endpoints[svc] = after
            # Before the Services are listed every slice looks orphaned: that is only the
            # order the lists arrived in (10,000 log lines at start otherwise).
            listed = "Service" in self._synced_kinds
            if listed and svc not in self._services and svc not in self._warned_orphans:
                self._warned_orphans.add(svc)
                self.skipped["EndpointSlice"] += 1
                self.skipped_recent.append(("EndpointSlice", str(svc), "its Service is unknown"))
                log.info("EndpointSlices for unknown service %s: no rules until it exists", svc)
        else:
            self._endpoints.pop(svc, None)
            self._warned_orphans.discard(svc)
        self._mark(self._pending_endpoints, svc, before, after)
        return True

    def _on_node(self, obj: Mapping[str, Any], deleted: bool) -> bool:
        try:
            info = convert.node_info(obj)
        except convert.BadObject as err:
            self._skip(err)
            return False
        if info.name != self.node_name:
            log.error(
                "Node event for %s, but this proxy runs on %s; ignoring", info.name, self.node_name
            )
            return False
        if deleted:
            info = NodeInfo(name=self.node_name, labels={}, exists=False)
        if info == self._node:
            return False
        # Whether the labels differ from what the last sync saw is decided by take(): an
        # assignment here would erase a full sync another change (a ServiceCIDR) set up.
        if self._labels_changed(info):
            self._seen_now()
        self._node = info
        return True

    def _labels_changed(self, node: NodeInfo) -> bool:
        return dict(node.labels) != dict(self._synced_node_labels)

    def _on_service_cidr(self, obj: Mapping[str, Any], deleted: bool) -> bool:
        try:
            name = convert.object_key(obj, "ServiceCIDR").name
            cidrs = () if deleted else convert.service_cidr(obj)
        except convert.BadObject as err:
            self._skip(err)
            return False
        before = self._service_cidrs.get(name, ())
        if cidrs == before:
            return False
        if cidrs:
            self._service_cidrs[name] = cidrs
        else:
            self._service_cidrs.pop(name, None)
        self._cidrs_changed = True  # the static part of the rules changes: a full sync
        self._seen_now()
        return True

    # ---- output side ------------------------------------------------------------------

    @property
    def node(self) -> NodeInfo:
        with self._lock:
            return self._node

    def pending_counts(self) -> tuple[int, int]:
        """(service changes, endpoint changes) waiting for a sync."""
        with self._lock:
            return len(self._pending_services), len(self._pending_endpoints)

    def current_state(self) -> ProxyState:
        with self._lock:
            return self._state_locked()

    def _state_locked(self) -> ProxyState:
        cidrs = tuple(dict.fromkeys(c for v in self._service_cidrs.values() for c in v))
        return ProxyState(self._ports, self._eps, self._node, self._by_service, cidrs)

    def take(self) -> Changes:
        """Consume everything pending: the returned state becomes the new 'last synced'."""
        with self._lock:
            pending = self._pending_any()
            result = Changes(
                state=self._state_locked(),
                changed_services=frozenset(
                    self._pending_services.keys() | self._pending_endpoints.keys()
                ),
                service_changes=len(self._pending_services),
                endpoint_changes=len(self._pending_endpoints),
                full_reason=self._full_reason_locked(),
                trigger_times={
                    k: tuple(v)
                    for k, v in self._trigger_times.items()
                    if k in self._pending_endpoints
                },
                first_seen=self._first_seen if pending else None,
                first_seen_wall=self._first_seen_wall if pending else None,
                generation=self.generation,
            )
            self._synced_node_labels = dict(self._node.labels)
            self._pending_services.clear()
            self._pending_endpoints.clear()
            self._trigger_times.clear()
            self._first_seen = self._first_seen_wall = None
            self._cidrs_changed = False
            return result

    def _full_reason_locked(self) -> str:
        reasons = [
            *(["node labels changed"] if self._labels_changed(self._node) else []),
            *(["service CIDRs changed"] if self._cidrs_changed else []),
        ]
        return ", ".join(reasons)

    def _pending_any(self) -> bool:
        return bool(
            self._pending_services
            or self._pending_endpoints
            or self._cidrs_changed
            or self._labels_changed(self._node)
        )
