"""HTTP endpoints operators probe: proxy health (/healthz, /livez on --healthz-bind-address),
metrics (/metrics, /proxyMode on --metrics-bind-address), and health-check node ports.

Shapes follow upstream (pkg/proxy/healthcheck): /healthz and /livez answer JSON
``{"lastUpdated": ..., "currentTime": ...}`` (+ ``"nodeEligible"`` on /healthz), 200 while no
queued change has waited longer than the health timeout (2 x sync period) and 503 after; /healthz
is also 503 while the node is being deleted or carries the ToBeDeletedByClusterAutoscaler
taint. A LoadBalancer service with externalTrafficPolicy=Local gets an HTTP server on its
healthCheckNodePort that answers 200 with the local endpoint count while this node has local
ready endpoints, 503 otherwise, so cloud load balancers pick nodes with pods.
"""

from __future__ import annotations

import json
import logging
import socket
import socketserver
import threading
import time
import urllib.parse
from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from pyproxy.model.types import NamespacedName, NodeInfo, ProxyState

log = logging.getLogger(__name__)


def _go_time(t: float) -> str:
    """Go's time.String() layout, which upstream's %q prints."""
    d = datetime.fromtimestamp(t, tz=UTC)
    return d.strftime("%Y-%m-%d %H:%M:%S.") + f"{d.microsecond * 1000:09d} +0000 UTC"


class ProxyHealth:
    """Upstream's proxierHealthServer, reading the facts when asked: the oldest change not yet
    programmed (``unprogrammed_since``: the tracker's pending changes and those a failed sync
    consumed), the last successful sync, and the Node."""

    def __init__(
        self,
        timeout: float,
        unprogrammed_since: Callable[[], float | None] = lambda: None,
        node: Callable[[], NodeInfo | None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.timeout = timeout
        self._since = unprogrammed_since
        self._node = node
        self._clock = clock
        self._last_updated: float | None = None

    def updated(self) -> None:
        """Rules were programmed (a successful sync), or the proxy is starting up."""
        self._last_updated = self._clock()

    @property
    def node_eligible(self) -> bool:
        node = self._node()
        return node is None or node.eligible or not node.exists

    def status(self, with_node: bool) -> tuple[int, dict[str, Any]]:
        now = self._clock()
        since = self._since()
        healthy = since is None or now - since < self.timeout
        last = self._last_updated
        eligible = self.node_eligible
        if with_node:
            healthy = healthy and eligible
        body: dict[str, Any] = {
            "lastUpdated": _go_time(now if healthy or last is None else last),
            "currentTime": _go_time(now),
        }
        if with_node:
            body["nodeEligible"] = eligible
        return (200 if healthy else 503), body


Route = Callable[[str, Mapping[str, str]], tuple[int, str, bytes] | None]
"""(path, query) -> (status, content type, body), or None for 404."""


def _json_handler(route: Route) -> type:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            res = route(path, dict(urllib.parse.parse_qsl(query)))
            if res is None:
                self.send_error(404)
                return
            code, ctype, body = res
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("%s %s", self.address_string(), fmt % args)

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, port: int, handler: type) -> None:
        # A wildcard ("0.0.0.0" too) takes both families, as Go's listener does for upstream:
        # its default 0.0.0.0:10256 answers the kubelet's probes to an IPv6 node address, and
        # so must this one (in an IPv6 cluster the pod was never Ready, and was restarted).
        self.dual = host in ("", "0.0.0.0", "::") and _has_ipv6()
        host = "::" if self.dual else host
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), handler)

    def server_bind(self) -> None:
        """HTTPServer's own asks getfqdn() of the address, a reverse DNS lookup. On a node
        whose name server is a Service that this proxy has yet to program, that waited for
        the resolver's timeouts: 10 s per server before the first sync in a real cluster."""
        if self.dual:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = (
            str(self.server_address[0]),
            int(self.server_address[1]),
        )


def _has_ipv6() -> bool:
    """Whether this network namespace can open an IPv6 socket (IPv6 may be disabled)."""
    try:
        socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()
    except OSError:
        return False
    return True


def serve(host: str, port: int, route: Route, name: str) -> _Server:
    """Start an HTTP server in a daemon thread; raises OSError if the port is taken."""
    server = _Server(host, port, _json_handler(route))
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    log.info("serving %s on %s:%d", name, host, server.server_address[1])
    return server


def health_routes(health: ProxyHealth, counter: Callable[[str, int], None] | None = None) -> Route:
    def route(path: str, _query: Mapping[str, str]) -> tuple[int, str, bytes] | None:
        if path not in ("/healthz", "/livez"):
            return None
        code, body = health.status(with_node=path == "/healthz")
        if counter is not None:
            counter(path, code)
        return code, "application/json", json.dumps(body).encode()

    return route


def metrics_routes(registry: CollectorRegistry, mode: str, more: Route | None = None) -> Route:
    """/metrics, /proxyMode, /healthz, then ``more`` (the debug routes)."""

    def route(path: str, query: Mapping[str, str]) -> tuple[int, str, bytes] | None:
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(registry)
        if path == "/proxyMode":
            return 200, "text/plain; charset=utf-8", mode.encode()
        if path == "/healthz":
            return 200, "text/plain; charset=utf-8", b"ok"
        return more(path, query) if more is not None else None

    return route


def health_check(state: ProxyState, svc: NamespacedName) -> tuple[int, int]:
    """(health-check node port or 0, ready endpoints on this node) of one service."""
    port = count = 0
    for sp in state.service_ports(svc):
        if sp.health_check_node_port:
            port = sp.health_check_node_port
            local = [
                ep
                for ep in state.endpoints.get(sp.name, ())
                if ep.ready and ep.node_name == state.node.name
            ]
            count = max(count, len(local))
    return port, count


class ServiceHealthServer:
    """One listener per healthCheckNodePort, opened and closed as services come and go."""

    def __init__(
        self, host: str = "0.0.0.0", proxy_healthy: Callable[[], bool] = lambda: True
    ) -> None:
        self.host = host
        self.proxy_healthy = proxy_healthy
        self._servers: dict[int, _Server] = {}
        self._owner: dict[int, NamespacedName] = {}
        self._counts: dict[NamespacedName, tuple[int, int]] = {}
        """service -> (its health-check node port, its ready endpoints on this node)"""
        self._lock = threading.Lock()

    def ports(self) -> dict[int, NamespacedName]:
        with self._lock:
            return dict(self._owner)

    def sync(self, state: ProxyState, changed: Collection[NamespacedName] | None = None) -> None:
        """Follow the services in ``changed`` (None: every service) to ``state``: open, close
        or update the health-check node ports they own."""
        services = state.service_names() if changed is None else changed
        with self._lock:
            if changed is None:
                self._owner.clear()
                self._counts.clear()
            for svc in services:
                port, count = health_check(state, svc)
                old = self._counts.pop(svc, None)
                if old is not None and self._owner.get(old[0]) == svc:
                    del self._owner[old[0]]
                if port:
                    self._owner[port] = svc
                    self._counts[svc] = (port, count)
            for port in [p for p in self._servers if p not in self._owner]:
                self._servers.pop(port).shutdown()
            missing = {p: s for p, s in self._owner.items() if p not in self._servers}
        for port, svc in missing.items():
            try:
                self._servers[port] = serve(
                    self.host, port, self._route(port), f"healthcheck-{port}"
                )
            except OSError as err:
                log.error("cannot serve health check node port %d for %s: %s", port, svc, err)

    def _route(self, port: int) -> Route:
        def route(_path: str, _query: Mapping[str, str]) -> tuple[int, str, bytes] | None:
            with self._lock:
                svc = self._owner.get(port)
                count = self._counts.get(svc, (0, 0))[1] if svc else 0
            healthy = self.proxy_healthy()
            body = {
                "service": {
                    "namespace": svc.namespace if svc else "",
                    "name": svc.name if svc else "",
                },
                "localEndpoints": count,
                "serviceProxyHealthy": healthy,
            }
            code = 200 if count > 0 and healthy else 503
            return code, "application/json", json.dumps(body).encode()

        return route

    def close(self) -> None:
        with self._lock:
            for server in self._servers.values():
                server.shutdown()
            self._servers.clear()
