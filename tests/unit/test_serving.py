"""The HTTP servers (healthz, metrics) start without asking any name server: HTTPServer's own
bind asks getfqdn() of the address, and on a node whose DNS is a Service the proxy has not
programmed yet that waited for resolver timeouts before the first sync."""

from __future__ import annotations

import json
import socket
import urllib.request

import pytest

from pyproxy.serving.health import ProxyHealth, health_routes, serve


def test_serve_binds_without_a_name_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> str:
        raise AssertionError("a name lookup at bind")

    for name in ("getfqdn", "gethostbyaddr", "gethostbyname"):
        monkeypatch.setattr(socket, name, refuse)
    server = serve("127.0.0.1", 0, health_routes(ProxyHealth(timeout=60)), "healthz")
    try:
        port = server.server_address[1]
        assert server.server_name == "127.0.0.1" and server.server_port == port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=5) as r:
            assert r.status == 200
            assert set(json.loads(r.read())) >= {"lastUpdated", "currentTime"}
    finally:
        server.shutdown()
        server.server_close()
