"""The userspace proxy engine: one asyncio listener per service port, relaying to endpoints.
Shared: userspace mode listens on an ephemeral port behind REDIRECT rules; nftables mode
serves localhost NodePorts (127.0.0.1 and ::1, TCP) with it.

Per service port: round robin over its endpoints, ClientIP affinity with a timeout, a
connect timeout with retry on the next endpoint when one refuses or does not answer (as
upstream's userspace proxier did), a cap on concurrent connections, and UDP "sessions" keyed
by client address with an idle timeout. TCP half-close is passed through (EOF one way does not
end the other). Memory per connection is bounded: each direction reads at most CHUNK bytes
and waits for the writer to drain below its high-water mark before reading more, so a slow
peer slows the other side instead of filling pyproxy's memory.

Runs its own event loop in a thread; ``Relay`` methods are thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

CHUNK = 64 * 1024
WRITE_HIGH_WATER = 256 * 1024


@dataclass(frozen=True)
class PortSpec:
    protocol: str  # "tcp" | "udp"
    endpoints: tuple[tuple[str, int], ...]
    affinity_seconds: int = 0
    name: str = ""
    host: str = "0.0.0.0"
    port: int = 0
    """Where to listen; port 0 picks a free one."""


@dataclass
class _Balancer:
    endpoints: tuple[tuple[str, int], ...] = ()
    affinity_seconds: int = 0
    next: int = 0
    sticky: dict[str, tuple[tuple[str, int], float]] = field(default_factory=dict)

    def order(self, client: str) -> list[tuple[str, int]]:
        """Endpoints to try for ``client``, best first."""
        eps = list(self.endpoints)
        if not eps:
            return []
        now = time.monotonic()
        if self.affinity_seconds:
            hit = self.sticky.get(client)
            if hit and hit[0] in eps and now - hit[1] < self.affinity_seconds:
                i = eps.index(hit[0])
                return eps[i:] + eps[:i]
        i = self.next % len(eps)
        self.next = i + 1
        return eps[i:] + eps[:i]

    def chose(self, client: str, ep: tuple[str, int]) -> None:
        if self.affinity_seconds:
            self.sticky[client] = (ep, time.monotonic())


class _Listener:
    def __init__(self, relay: Relay, spec: PortSpec) -> None:
        self.relay = relay
        self.spec = spec
        self.balancer = _Balancer(spec.endpoints, spec.affinity_seconds)
        self.port = 0
        self.active = 0
        self.server: asyncio.AbstractServer | None = None
        self.udp: asyncio.DatagramTransport | None = None
        self.sessions: dict[tuple[str, int], _UdpSession] = {}
        self.connections = 0
        """Connections (TCP) and flows (UDP) relayed to an endpoint."""
        self.bytes = 0
        """Payload bytes relayed, both directions."""

    def count(self, n: int) -> None:
        self.bytes += n

    def update(self, spec: PortSpec) -> None:
        self.spec = spec
        self.balancer.endpoints = spec.endpoints
        self.balancer.affinity_seconds = spec.affinity_seconds

    async def start(self) -> None:
        if self.spec.protocol == "tcp":
            self.server = await asyncio.start_server(
                self.handle, self.spec.host, self.spec.port, limit=CHUNK, reuse_address=True
            )
            self.port = self.server.sockets[0].getsockname()[1]
        else:
            loop = asyncio.get_running_loop()
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _UdpListener(self), local_addr=(self.spec.host, self.spec.port)
            )
            self.udp = transport
            self.port = transport.get_extra_info("sockname")[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.udp is not None:
            self.udp.close()
        for s in list(self.sessions.values()):
            s.close()

    async def connect(self, client: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        for ep in self.balancer.order(client):
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(ep[0], ep[1], limit=CHUNK), self.relay.connect_timeout
                )
            except (TimeoutError, OSError) as err:
                log.info(
                    "%s: endpoint %s:%d failed (%s); trying the next",
                    self.spec.name,
                    ep[0],
                    ep[1],
                    type(err).__name__,
                )
                continue
            self.balancer.chose(client, ep)
            return reader, writer
        raise ConnectionError(f"{self.spec.name}: no endpoint accepted the connection")

    async def handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        client = cwriter.get_extra_info("peername")[0]
        if self.active >= self.relay.max_connections:
            log.warning(
                "%s: %d concurrent connections (the cap); refusing one from %s",
                self.spec.name,
                self.active,
                client,
            )
            cwriter.close()
            return
        self.active += 1
        try:
            try:
                breader, bwriter = await self.connect(client)
            except ConnectionError as err:
                log.warning("%s", err)
                return
            self.connections += 1
            for w in (cwriter, bwriter):
                w.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
            try:
                await asyncio.gather(
                    _pipe(creader, bwriter, self.count), _pipe(breader, cwriter, self.count)
                )
            finally:
                bwriter.close()
        finally:
            self.active -= 1
            with contextlib.suppress(Exception):
                cwriter.close()


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count: Callable[[int], None]
) -> None:
    """Copy until EOF, then half-close the other side; backpressure through drain()."""
    try:
        while data := await reader.read(CHUNK):
            count(len(data))
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


class _UdpListener(asyncio.DatagramProtocol):
    def __init__(self, owner: _Listener) -> None:
        self.owner = owner

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        o = self.owner
        session = o.sessions.get(addr)
        if session is None:
            eps = o.balancer.order(addr[0])
            if not eps:
                return
            session = _UdpSession(o, addr, eps[0])
            o.balancer.chose(addr[0], eps[0])
            o.sessions[addr] = session
            o.connections += 1
        session.send(data)


class _UdpSession:
    """One client's flow: a connected socket to its endpoint, closed when idle."""

    def __init__(self, owner: _Listener, client: tuple[str, int], ep: tuple[str, int]) -> None:
        self.owner = owner
        self.client = client
        self.last = time.monotonic()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.sock.connect(ep)
        loop = asyncio.get_running_loop()
        loop.add_reader(self.sock.fileno(), self._reply)
        self.timer = loop.call_later(owner.relay.udp_idle_timeout, self._check_idle)

    def send(self, data: bytes) -> None:
        self.last = time.monotonic()
        with contextlib.suppress(OSError):
            self.sock.send(data)
            self.owner.count(len(data))

    def _reply(self) -> None:
        try:
            data = self.sock.recv(65535)
        except OSError:
            return
        self.last = time.monotonic()
        if self.owner.udp is not None:
            self.owner.udp.sendto(data, self.client)
            self.owner.count(len(data))

    def _check_idle(self) -> None:
        idle = time.monotonic() - self.last
        timeout = self.owner.relay.udp_idle_timeout
        if idle >= timeout:
            self.close()
        else:
            self.timer = asyncio.get_running_loop().call_later(timeout - idle, self._check_idle)

    def close(self) -> None:
        self.owner.sessions.pop(self.client, None)
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(self.sock.fileno())
        self.timer.cancel()
        self.sock.close()


class Relay:
    def __init__(
        self,
        connect_timeout: float = 1.0,
        udp_idle_timeout: float = 30.0,
        max_connections: int = 1000,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.udp_idle_timeout = udp_idle_timeout
        self.max_connections = max_connections
        self.loop = asyncio.new_event_loop()
        self._listeners: dict[str, _Listener] = {}
        self.failed: dict[str, str] = {}
        """Keys the last apply could not listen for, with why."""
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="userspace-relay", daemon=True
        )
        self._thread.start()

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def apply(self, specs: Mapping[str, PortSpec]) -> dict[str, int]:
        """Make the listeners match ``specs`` (key -> spec); returns key -> local port."""
        return dict(self._run(self._apply(specs)))

    def change(self, delta: Mapping[str, PortSpec | None]) -> None:
        """Add, update (None: remove) only the listeners named in ``delta``."""
        self._run(self._change(delta))

    async def _apply(self, specs: Mapping[str, PortSpec]) -> dict[str, int]:
        delta: dict[str, PortSpec | None] = {k: None for k in self._listeners if k not in specs}
        delta.update(specs)
        await self._change(delta)
        return {k: v.port for k, v in self._listeners.items()}

    async def _change(self, delta: Mapping[str, PortSpec | None]) -> None:
        """A listener that cannot bind (another program has its address) is left out and
        named in ``failed``; the others are unaffected."""
        self.failed = {k: why for k, why in self.failed.items() if k not in delta}
        for key, spec in delta.items():
            old = self._listeners.get(key)
            if old is not None and (
                spec is None
                or (spec.protocol, spec.host, spec.port)
                != (old.spec.protocol, old.spec.host, old.spec.port)
            ):
                await old.stop()
                del self._listeners[key]
                old = None
            if spec is None:
                continue
            if old is not None:
                old.update(spec)  # open connections keep their endpoint
                continue
            lst = _Listener(self, spec)
            try:
                await lst.start()
            except OSError as err:
                self.failed[key] = f"cannot listen on {spec.host} port {spec.port}: {err}"
                continue
            self._listeners[key] = lst

    def ports(self) -> dict[str, int]:
        return {k: v.port for k, v in self._listeners.items()}

    def traffic(self) -> dict[str, tuple[str, int, int]]:
        """Listener key -> (its service port's name, connections or flows relayed, bytes)
        since the listener opened."""
        return {k: (v.spec.name, v.connections, v.bytes) for k, v in list(self._listeners.items())}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._run(self._apply({}))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
