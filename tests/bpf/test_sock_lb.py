"""pyproxy's socket-level balancing programs (``backends/ebpf/bpf/sock_lb.c``) on this kernel,
loaded through the libbpf port and attached only to a child cgroup the test makes, with the
service entries written by hand in the programs' map layout: a client process in that cgroup
reaches a pod through a service address nothing routes, sees the service as its peer, gets
its UDP replies from the service address, is refused for a service without endpoints, and
keeps to one endpoint under affinity; the same client outside the cgroup is not translated.

Everything lives in two namespaces of the test's own (a client and a pod joined by a veth);
the programs are detached, the cgroup removed and the namespaces deleted afterwards, also
when a test fails."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyproxy.backends.ebpf.render import Balanced
from pyproxy.kernel.bpf import Map
from pyproxy.kernel.libbpf import BpfObject, Link
from pyproxy.model.types import Endpoint, Protocol

OBJECT = Path(__file__).parents[2] / "pyproxy/backends/ebpf/bpf/sock_lb.o"
PROGRAMS = ("connect4", "sendmsg4", "recvmsg4", "getpeername4")
POD = "10.0.0.2"
AFFINITY = 1

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="BPF programs need root")


def cgroup2_root() -> Path:
    for line in Path("/proc/mounts").read_text().splitlines():
        _, where, kind, *_ = line.split()
        if kind == "cgroup2":
            return Path(where)
    pytest.fail("no cgroup2 mount on this machine")


def mapped(ip: str) -> bytes:
    return b"\0" * 10 + b"\xff\xff" + socket.inet_aton(ip)


def key(vip: str, port: int, proto: int, slot: int) -> bytes:
    """struct svc_key: address (16, IPv4-mapped), port (network order), protocol, pad, slot."""
    return mapped(vip) + struct.pack("!H", port) + bytes([proto, 0]) + struct.pack("=I", slot)


def head(count: int, flags: int = 0, timeout: int = 0, ident: int = 0) -> bytes:
    """struct svc_value of slot 0: no address, the endpoint count, flags, affinity."""
    return bytes(16) + struct.pack("=HHIII", 0, flags, count, timeout, ident)


def endpoint(ip: str, port: int) -> bytes:
    return mapped(ip) + struct.pack("!H", port) + struct.pack("=HIII", 0, 0, 0, 0)


def member(vip: str, port: int, proto: int, ip: str, ep_port: int) -> bytes:
    """struct member_key: the service's address, port, protocol, pad; the endpoint's."""
    return (mapped(vip) + struct.pack("!H", port) + bytes([proto, 0]) + mapped(ip)
            + struct.pack("!H", ep_port) + bytes(2))  # fmt: skip


def service(m: Map, vip: str, port: int, proto: int, eps: list[tuple[str, int]],
            flags: int = 0, timeout: int = 0, ident: int = 0,
            members: Map | None = None) -> None:  # fmt: skip
    for i, (ip, p) in enumerate(eps, 1):
        if members is not None:
            members.update(member(vip, port, proto, ip, p), b"\x01\0\0\0")
        m.update(key(vip, port, proto, i), endpoint(ip, p))
    m.update(key(vip, port, proto, 0), head(len(eps), flags, timeout, ident))


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[str, str]]:
    """(client namespace, pod namespace), with echo servers in the pod: TCP on 8080 and 8081
    (each answers its own port), UDP on 5353 and 5354 (likewise)."""
    tag = uuid.uuid4().hex[:6]
    client, pod = f"pyk-bc-{tag}", f"pyk-bp-{tag}"
    servers: list[subprocess.Popen[bytes]] = []
    sh("ip", "netns", "add", client)
    sh("ip", "netns", "add", pod)
    try:
        sh("ip", "link", "add", "c0", "netns", client, "type", "veth", "peer", "p0", "netns", pod)
        for ns, dev, addr in ((client, "c0", "10.0.0.1/24"), (pod, "p0", f"{POD}/24")):
            sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        for port in (8080, 8081):
            servers.append(subprocess.Popen(["ip", "netns", "exec", pod, sys.executable, "-c", (
                "import socket\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,"
                f"socket.SO_REUSEADDR,1);s.bind(('0.0.0.0',{port}));s.listen(64)\n"
                "while True:\n c,a=s.accept();c.sendall(b'%d' % s.getsockname()[1]);c.close()"
            )]))  # fmt: skip
        for port in (5353, 5354):
            servers.append(subprocess.Popen(["ip", "netns", "exec", pod, sys.executable, "-c", (
                "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
                f"s.bind(('0.0.0.0',{port}))\nwhile True:\n d,a=s.recvfrom(100);"
                f"s.sendto(b'{port} '+d,a)"
            )]))  # fmt: skip
        yield client, pod
    finally:
        for s in servers:
            s.kill()
            s.wait()
        subprocess.run(["ip", "netns", "del", client], check=False)
        subprocess.run(["ip", "netns", "del", pod], check=False)


@pytest.fixture(scope="module")
def attached() -> Iterator[tuple[Map, Path, Map]]:
    """The programs attached to a child cgroup of the test's own (never a mount's root: that
    is the machine's root cgroup); the services map; the cgroup; the members map."""
    assert OBJECT.exists(), f"{OBJECT} is not built: run make install"
    cgroup = cgroup2_root() / f"pyproxy-test-{uuid.uuid4().hex[:8]}"
    cgroup.mkdir()
    links: list[Link] = []
    obj = BpfObject(str(OBJECT))
    try:
        links += [obj.attach_cgroup(p, str(cgroup)) for p in PROGRAMS]
        with obj.map("services") as services, obj.map("members") as members:
            yield services, cgroup, members
    finally:
        for link in links:
            link.destroy()
        obj.close()
        cgroup.rmdir()


def run_in(cgroup: Path | None, ns: str, code: str) -> str:
    """Python ``code`` in namespace ``ns``, its process in ``cgroup`` first (None: where the
    test runs); bounded by a timeout."""
    join = f"echo $$ > {cgroup}/cgroup.procs; " if cgroup else ""
    argv = ["sh", "-c", f'{join}exec ip netns exec {ns} "$0" -c "$1"', sys.executable, code]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


TCP_CLIENT = """
import socket
out = []
for _ in range({n}):
    try:
        s = socket.create_connection(("{vip}", {port}), timeout=3)
        out.append(s.recv(10).decode() + "@" + ":".join(map(str, s.getpeername())))
        s.close()
    except OSError as e:
        out.append("errno " + str(e.errno))
print(" ".join(out))
"""


def test_a_connection_to_the_service_reaches_the_pod_and_shows_the_service(
    world: tuple[str, str], attached: tuple[Map, Path, Map]
) -> None:
    services, cgroup, _ = attached
    service(services, "10.96.0.10", 80, socket.IPPROTO_TCP, [(POD, 8080)])
    out = run_in(cgroup, world[0], TCP_CLIENT.format(n=1, vip="10.96.0.10", port=80))
    assert out == "8080@10.96.0.10:80"


def test_outside_the_cgroup_nothing_is_translated(
    world: tuple[str, str], attached: tuple[Map, Path, Map]
) -> None:
    services, _, _ = attached
    service(services, "10.96.0.10", 80, socket.IPPROTO_TCP, [(POD, 8080)])
    out = run_in(None, world[0], TCP_CLIENT.format(n=1, vip="10.96.0.10", port=80))
    assert out == "errno 101"  # ENETUNREACH: the client has no route to service addresses


def test_a_service_without_endpoints_refuses(
    world: tuple[str, str], attached: tuple[Map, Path, Map]
) -> None:
    services, cgroup, _ = attached
    service(services, "10.96.0.11", 80, socket.IPPROTO_TCP, [])
    out = run_in(cgroup, world[0], TCP_CLIENT.format(n=1, vip="10.96.0.11", port=80))
    assert out == "errno 111"  # ECONNREFUSED, as kube-proxy's REJECT


def test_connections_spread_over_endpoints_and_affinity_keeps_one(
    world: tuple[str, str], attached: tuple[Map, Path, Map]
) -> None:
    services, cgroup, members = attached
    eps = [(POD, 8080), (POD, 8081)]
    service(services, "10.96.0.12", 80, socket.IPPROTO_TCP, eps)
    spread = run_in(cgroup, world[0], TCP_CLIENT.format(n=40, vip="10.96.0.12", port=80))
    assert set(spread.split()) == {"8080@10.96.0.12:80", "8081@10.96.0.12:80"}
    service(services, "10.96.0.13", 80, socket.IPPROTO_TCP, eps, AFFINITY, 10800, 13, members)
    sticky = run_in(cgroup, world[0], TCP_CLIENT.format(n=20, vip="10.96.0.13", port=80))
    assert len(set(sticky.split())) == 1, sticky
    # the remembered endpoint stops being a member: the client is spread again, then kept
    kept = int(sticky.split()[0].split("@")[0])
    assert members.delete(member("10.96.0.13", 80, socket.IPPROTO_TCP, POD, kept))
    other = run_in(cgroup, world[0], TCP_CLIENT.format(n=1, vip="10.96.0.13", port=80))
    assert other in {"8080@10.96.0.13:80", "8081@10.96.0.13:80"}


def test_udp_replies_come_from_the_service_address(
    world: tuple[str, str], attached: tuple[Map, Path, Map]
) -> None:
    services, cgroup, _ = attached
    service(services, "10.96.0.53", 53, socket.IPPROTO_UDP, [(POD, 5353)])
    out = run_in(cgroup, world[0], (
        "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(3)\n"
        "s.sendto(b'q',('10.96.0.53',53));d,a=s.recvfrom(100);print(d.decode(),a[0],a[1])"
    ))  # fmt: skip
    assert out == "5353 q 10.96.0.53 53"


UDP_SOCKETS = """
import socket
seen = []
for _ in range(20):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    ports = set()
    for _ in range(10):
        s.sendto(b"q", ("10.96.0.54", 53))
        ports.add(s.recvfrom(100)[0].split()[0].decode())
    seen.append(",".join(sorted(ports)))
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    c.connect(("10.96.0.54", 53))
    seen.append("connected")
except OSError as e:
    seen.append("errno_%d" % e.errno)
print(" ".join(seen))
"""


def test_a_udp_socket_keeps_one_endpoint_and_a_connected_one_is_left_to_the_rules(
    world: tuple[str, str], attached: tuple[Map, Path, Map]
) -> None:
    """Ten datagrams of one unconnected socket reach one endpoint (as one conntrack flow
    does through the rules); twenty sockets between them reach both. Connecting a UDP socket
    is not translated: here, with no rules and no route to service addresses, it fails."""
    services, cgroup, _ = attached
    service(services, "10.96.0.54", 53, socket.IPPROTO_UDP, [(POD, 5353), (POD, 5354)])
    out = run_in(cgroup, world[0], UDP_SOCKETS).split()
    assert set(out[:20]) == {"5353", "5354"}, out  # one endpoint per socket, both used
    assert out[20] == "errno_101", out  # ENETUNREACH: the connect went untranslated


def test_the_rendered_entries_are_what_the_programs_read(
    world: tuple[str, str], attached: tuple[Map, Path, Map]
) -> None:
    """``backends/ebpf/layout.py`` against the programs: a rendered service, written as is."""
    services, cgroup, members = attached
    eps = (Endpoint(ipaddress.ip_address(POD), 8080), Endpoint(ipaddress.ip_address(POD), 8081))
    vip = ipaddress.ip_address("10.96.0.20")
    services.update_batch(Balanced(vip, 80, Protocol.TCP, "ns/svc:http", eps).entries().items())
    spread = run_in(cgroup, world[0], TCP_CLIENT.format(n=40, vip=vip, port=80))
    assert set(spread.split()) == {"8080@10.96.0.20:80", "8081@10.96.0.20:80"}
    sticky = Balanced(ipaddress.ip_address("10.96.0.21"), 80, Protocol.TCP, "ns/svc:http", eps, 60)
    members.update_batch(sticky.members().items())
    services.update_batch(sticky.entries().items())
    kept = run_in(cgroup, world[0], TCP_CLIENT.format(n=20, vip="10.96.0.21", port=80))
    assert len(set(kept.split())) == 1, kept
