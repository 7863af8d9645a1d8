"""A TCP relay from a network namespace's loopback to the machine's loopback.

pyproxy and upstream kube-proxy run inside node namespaces, while the test API server listens
on the machine's 127.0.0.1 only. The relay listens inside the node namespace (its socket is
created after setns(2) into it) and connects out from the machine's namespace, so nothing is
routed or addressed outside loopback. It doubles as the fault injector between a proxy and
the API server: ``cut()`` drops every open connection mid-stream, ``partition()`` refuses new
ones until ``heal()``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import threading
from collections.abc import Iterator

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


@contextlib.contextmanager
def netns(path: str) -> Iterator[None]:
    """Run the body with this thread in the network namespace at ``path``."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns into " + path)
        try:
            yield
        finally:
            if _libc.setns(own, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back")
    finally:
        os.close(own)
        os.close(target)


class Relay:
    def __init__(self, ns_name: str, listen_port: int, target: tuple[str, int]) -> None:
        self.target = target
        with netns(f"/run/netns/{ns_name}"):
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(("127.0.0.1", listen_port))
            self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._partitioned = False
        self._closed = False
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True, name=f"relay-{ns_name}").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if self._partitioned:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            self.accepted += 1
            with self._lock:
                self._conns |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            with self._lock:
                self._conns -= {src, dst}

    def cut(self) -> int:
        """Drop every open connection (both ends see a reset/EOF mid-stream)."""
        with self._lock:
            conns = list(self._conns)
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        return len(conns) // 2

    def partition(self) -> None:
        self._partitioned = True
        self.cut()

    def heal(self) -> None:
        self._partitioned = False

    def close(self) -> None:
        self._closed = True
        self.partition()
        self.sock.close()
