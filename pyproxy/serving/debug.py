"""The daemon's own view for operators, served on the metrics address (loopback by default,
never the public health port): ``/debug/state`` (the model pyproxy would program now, the last
sync, pending changes and the latest skipped objects with their reasons), ``/debug/rules``
(the last transaction applied and the last that failed, with its error) and
``/debug/explain?service=NS/NAME[:PORT]``, ``/debug/traffic`` (per service port, what the
mode counted: the numbers behind ``--service-metrics``, also without it) and ``/debug/diff``
(the kernel against the daemon's own state, as ``pyproxy diff``). SIGUSR1 writes the
same state and rules to the log, for support ("incredibly useful", kubernetes/kubernetes#129061).
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyproxy.backends.base import (
    BackendError,
    Difference,
    ServiceTraffic,
    Transaction,
    TransactionLog,
    differences_doc,
)
from pyproxy.model.types import NamespacedName, ProxyState, ServicePort
from pyproxy.serving.health import Route

JSON = "application/json"


def jsonable(obj: Any) -> Any:
    """Model objects as JSON values: dataclasses as objects, addresses and names as strings."""
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, ipaddress._BaseAddress | ipaddress._BaseNetwork):
        return str(obj)
    if isinstance(obj, NamespacedName):
        return str(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, set | frozenset):
        return sorted((jsonable(v) for v in obj), key=str)
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    return str(obj)


def _port(sp: ServicePort, state: ProxyState) -> dict[str, Any]:
    doc = jsonable(sp)
    doc["name"] = str(sp.name)
    doc["protocol"] = sp.protocol.value
    doc["endpoints"] = [jsonable(ep) for ep in state.endpoints.get(sp.name, ())]
    return dict(doc)


def state_doc(state: ProxyState, status: Mapping[str, Any], skipped: list[tuple[str, str, str]]
              ) -> dict[str, Any]:  # fmt: skip
    services: dict[str, list[dict[str, Any]]] = {}
    for sp in sorted(state.services.values(), key=lambda p: str(p.name)):
        services.setdefault(str(sp.name.service), []).append(_port(sp, state))
    return {
        **status,
        "node": jsonable(state.node),
        "serviceCIDRs": [str(c) for c in state.service_cidrs],
        "services": services,
        "skipped": [{"kind": k, "object": ref, "reason": why} for k, ref, why in skipped],
    }


def _transaction(t: Transaction | None) -> dict[str, Any] | None:
    if t is None:
        return None
    doc = {"at": t.at, "what": t.what, "bytes": t.size, "text": t.text}
    if t.size > len(t.text):
        doc["truncated"] = True
    if t.error:
        doc["error"] = t.error
    return doc


def rules_doc(log: TransactionLog) -> dict[str, Any]:
    return {
        "lastApplied": [_transaction(t) for t in log.applied],
        "lastFailed": _transaction(log.failed),
    }


@dataclass
class DebugView:
    """What the routes and the SIGUSR1 dump read; the daemon wires it (nothing here knows the
    tracker, the syncer or a backend)."""

    state: Callable[[], ProxyState]
    status: Callable[[], Mapping[str, Any]]
    skipped: Callable[[], list[tuple[str, str, str]]]
    transactions: TransactionLog
    explain: Callable[[ProxyState, NamespacedName, str | None], str]
    explain_data: Callable[[ProxyState, NamespacedName, str | None], list[dict[str, Any]]]
    traffic: Callable[[], Mapping[str, ServiceTraffic]]
    diff: Callable[[], Sequence[Difference]]

    def state_doc(self) -> dict[str, Any]:
        return state_doc(self.state(), self.status(), self.skipped())

    def rules_doc(self) -> dict[str, Any]:
        return rules_doc(self.transactions)

    def explain_text(self, query: Mapping[str, str]) -> tuple[int, str]:
        ref = query.get("service", "")
        ns, _, rest = ref.partition("/")
        name, _, port = rest.partition(":")
        if not ns or not name:
            return 400, "give ?service=NAMESPACE/NAME[:PORT][&output=json]\n"
        svc, state = NamespacedName(ns, name), self.state()
        if query.get("output") == "json":
            return 200, json.dumps(self.explain_data(state, svc, port or None), indent=1) + "\n"
        return 200, self.explain(state, svc, port or None)

    def routes(self) -> Route:
        def route(path: str, query: Mapping[str, str]) -> tuple[int, str, bytes] | None:
            if path == "/debug/state":
                return 200, JSON, json.dumps(self.state_doc(), indent=1).encode()
            if path == "/debug/rules":
                return 200, JSON, json.dumps(self.rules_doc(), indent=1).encode()
            if path == "/debug/diff":
                try:
                    diffs = self.diff()
                except BackendError as err:  # e.g. no privilege for the scratch namespace
                    return 503, "text/plain; charset=utf-8", f"{err}\n".encode()
                return 200, JSON, json.dumps(differences_doc(diffs), indent=1).encode()
            if path == "/debug/traffic":
                try:
                    doc = {k: dataclasses.asdict(v) for k, v in sorted(self.traffic().items())}
                except BackendError as err:  # a mode (or setting) without such counters
                    return 503, "text/plain; charset=utf-8", f"{err}\n".encode()
                except RuntimeError as err:  # a sync changed what was being read: try again
                    return 503, "text/plain; charset=utf-8", f"busy, try again: {err}\n".encode()
                return 200, JSON, json.dumps(doc, indent=1).encode()
            if path == "/debug/explain":
                code, text = self.explain_text(query)
                return code, "text/plain; charset=utf-8", text.encode()
            return None

        return route

    def dump(self) -> str:
        """The SIGUSR1 dump: one JSON document (state and rules) for the log."""
        return json.dumps({"state": self.state_doc(), "rules": self.rules_doc()}, indent=1)
