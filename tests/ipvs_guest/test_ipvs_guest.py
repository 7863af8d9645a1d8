"""IPVS mode on the kernel's real IPVS. Runs only inside the user-mode Linux guest
(tests/uml/test_ipvs_in_uml.py boots it); on the host these are skipped with that reason."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.netns import services, trace_cases
from tests.netns.scrape import METRICS_URL, check_mode_families, get, metric, scrape
from tests.netns.services import DNS, DNS_EP, HTTP, HTTP_EP, pods, svc
from tests.netns.trace_cases import check_predictions
from tests.netns.world import (
    CLUSTER_CIDR,
    CLUSTER_CIDR6,
    HERE,
    NODE_CLIENT_IP,
    PYPROXY,
    PYTHON,
    Held,
    Pyproxy,
    SyncCounts,
    World,
    manifest_objects,
    names_in,
    total,
    wait_for,
)

pytestmark = pytest.mark.skipif(
    os.environ.get("PYPROXY_IN_UML") != "1", reason="runs inside the user-mode Linux guest only"
)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    w = World("g").build(pod_count=3, client_count=2)
    try:
        yield w
    finally:
        w.close()


@pytest.fixture(scope="module")
def proxy(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pyproxy]:
    d = tmp_path_factory.mktemp("m")
    p = Pyproxy(
        world,
        d,
        d.parent / "pyproxy-ipvs.log",
        "--sync-period",
        "2s",
        "--metrics-bind-address",
        "127.0.0.1:10249",
        "--service-metrics",
        mode="ipvs",
    ).start()
    try:
        yield p
    finally:
        p.stop()
        print(p.log.read_text()[-3000:])


def test_auto_detection_takes_the_back_end_that_can_write(proxy: Pyproxy) -> None:
    """This guest's nf_tables lists the nat table but cannot create the ip filter table:
    without --iptables-backend, pyproxy must find that out at start and use legacy (every
    other test here runs on what it picked)."""
    proxy.wait_syncs(SyncCounts(), what="pyproxy's first sync", timeout=60)
    log = proxy.log.read_text()  # what it chose, and why, is logged at start
    assert "iptables: the nft back end cannot be used here (" in log
    assert "); using legacy" in log
    assert "ipvs mode: iptables legacy back end for IPv4" in log


def ipvsadm(world: World) -> str:
    return world.exec(world.node, "ipvsadm", "-Ln").stdout


def dest_weights(world: World, vip: str) -> dict[str, int]:
    """{real server: weight} of the virtual server at ``vip`` (from ipvsadm -Ln)."""
    out: dict[str, int] = {}
    current = ""
    for line in ipvsadm(world).splitlines():
        fields = line.split()
        if fields and fields[0] in ("TCP", "UDP", "SCTP"):
            current = fields[1]
        elif fields and fields[0] == "->" and current == vip and fields[1][0].isdigit():
            out[fields[1]] = int(fields[3])
    return out


# The guest is slower than the host: the shared wait, with a longer bound.
reachable = functools.partial(services.reachable, timeout=30)


def test_cluster_ip_and_node_port_round_robin(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "rr",
        *manifest_objects(
            world,
            svc(
                "rr",
                "10.96.7.1",
                [{**HTTP, "nodePort": 30180}, {**DNS, "nodePort": 30153}],
                type="NodePort",
            ),
            pods(world, 1, 2, 3),
            HTTP_EP + DNS_EP,
        ),
    )
    reachable(world, "10.96.7.1")
    r = world.probe("tcp", "10.96.7.1", 80, count=60)
    assert r["replies"] == {"pod-1": 20, "pod-2": 20, "pod-3": 20}  # rr: exactly even
    np = world.probe("tcp", NODE_CLIENT_IP, 30180, count=30)
    assert names_in(np) == {"pod-1", "pod-2", "pod-3"} and total(np) == 30
    udp = world.probe("udp", "10.96.7.1", 53, count=30)
    assert names_in(udp) == {"pod-1", "pod-2", "pod-3"} and total(udp) == 30
    listing = ipvsadm(world)
    assert "TCP  10.96.7.1:80 rr" in listing and "10.244.1.2:8080" in listing
    assert "10.96.7.1/32" in world.exec(world.node, "ip", "addr", "show", "kube-ipvs0").stdout
    assert "10.96.7.1,tcp:80" in world.exec(world.node, "ipset", "list", "KUBE-CLUSTER-IP").stdout


def test_persistence_pins_a_client(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "sticky",
        *manifest_objects(
            world,
            svc(
                "sticky",
                "10.96.7.2",
                [HTTP],
                sessionAffinity="ClientIP",
                sessionAffinityConfig={"clientIP": {"timeoutSeconds": 300}},
            ),
            pods(world, 1, 2, 3),
            HTTP_EP,
        ),
    )
    reachable(world, "10.96.7.2")
    r = world.probe("tcp", "10.96.7.2", 80, count=30)
    assert len(r["replies"]) == 1 and total(r) == 30
    assert "TCP  10.96.7.2:80 rr persistent 300" in ipvsadm(world)


def test_no_endpoints_refused(world: World, proxy: Pyproxy) -> None:
    proxy.write("empty", svc("empty", "10.96.7.3", [HTTP]))
    wait_for(lambda: "10.96.7.3:80" in ipvsadm(world), what="the virtual server")
    r = world.probe("tcp", "10.96.7.3", 80, count=3, timeout=3)
    assert r["errors"] == {"refused": 3}


def test_removed_endpoint_drains_then_disappears(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "drain",
        *manifest_objects(world, svc("drain", "10.96.7.4", [HTTP]), pods(world, 1, 2), HTTP_EP),
    )
    reachable(world, "10.96.7.4")
    held = Held(world, world.client(0), "10.96.7.4", 80)
    pod = held.pod
    keep = "pod-2" if pod == "pod-1" else "pod-1"
    ip = {"pod-1": "10.244.1.2", "pod-2": "10.244.2.2"}[pod]
    proxy.write(
        "drain",
        *manifest_objects(
            world,
            svc("drain", "10.96.7.4", [HTTP]),
            [p for p in world.pods if p.name == keep],
            HTTP_EP,
        ),
    )
    # weight 0: no new connections, but the open one keeps working
    wait_for(
        lambda: dest_weights(world, "10.96.7.4:80").get(f"{ip}:8080") == 0,
        what="weight 0 for the removed endpoint",
    )
    assert names_in(world.probe("tcp", "10.96.7.4", 80, count=10)) == {keep}
    assert held.say("still-there") == [pod, "still-there"]
    held.close()  # the client closes (with a reset): the real server can go
    wait_for(
        lambda: f"{ip}:8080" not in dest_weights(world, "10.96.7.4:80"),
        timeout=60,
        what="the drained real server to be deleted",
    )
    assert dest_weights(world, "10.96.7.4:80") == {
        {"pod-1": "10.244.1.2", "pod-2": "10.244.2.2"}[keep] + ":8080": 1
    }


def test_restart_keeps_connections(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "held", *manifest_objects(world, svc("held", "10.96.7.5", [HTTP]), pods(world, 3), HTTP_EP)
    )
    reachable(world, "10.96.7.5")
    held = Held(world, world.client(0), "10.96.7.5", 80)
    assert held.pod == "pod-3"
    proxy.stop()
    assert total(world.probe("tcp", "10.96.7.5", 80, count=5)) == 5
    before = proxy.syncs()
    proxy.start()
    wait_for(lambda: proxy.syncs() > before, what="the restarted pyproxy to sync")
    assert held.say("again") == ["pod-3", "again"]
    held.close()


def test_dual_stack_service(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "dual",
        *manifest_objects(
            world,
            svc(
                "dual",
                "10.96.7.6",
                [{**HTTP, "nodePort": 30181}, {**DNS, "nodePort": 30154}],
                type="NodePort",
                clusterIPs=["10.96.7.6", "fd00:96::76"],
                ipFamilies=["IPv4", "IPv6"],
                ipFamilyPolicy="RequireDualStack",
            ),
            pods(world, 1, 2),
            HTTP_EP + DNS_EP,
            ipv6=True,
        ),
    )
    reachable(world, "fd00:96::76")
    for host, port, proto in (
        ("fd00:96::76", 80, "tcp"),
        ("fd00:96::76", 53, "udp"),
        ("fd00:31::1", 30181, "tcp"),
        ("10.96.7.6", 80, "tcp"),
    ):
        r = world.probe(proto, host, port, count=20)
        assert names_in(r) == {"pod-1", "pod-2"} and total(r) == 20, (host, port, proto, r)
    assert "[fd00:96::76]:80 rr" in ipvsadm(world)
    assert "fd00:96::76" in world.exec(world.node, "ipset", "list", "KUBE-6-CLUSTER-IP").stdout


def test_diff_is_clean_then_names_a_deleted_real_server(world: World, proxy: Pyproxy) -> None:
    """``pyproxy diff --mode ipvs``: 0 after a sync; after a real server is deleted by hand,
    1 with that real server under its service."""
    proxy.write("dif", *manifest_objects(world, svc("dif", "10.96.7.20", [HTTP]), pods(world, 1, 2),
                                         HTTP_EP))  # fmt: skip
    reachable(world, "10.96.7.20")
    cidrs = f"{CLUSTER_CIDR},{CLUSTER_CIDR6}"
    args = [PYPROXY, "diff", "--mode", "ipvs", "--manifests", str(proxy.manifests),
            "--hostname-override", "node-a", "--cluster-cidr", cidrs]  # fmt: skip
    res = world.exec(world.node, *args, check=False)
    assert (res.returncode, res.stdout) == (
        0,
        "no differences: the kernel holds what pyproxy would program\n",
    ), res.stdout + res.stderr
    # The daemon compares its kernel with its own state alike (a two-second sync period here
    # would put a deleted server back before it looked: the clean case only).
    daemon = world.exec(world.node, PYPROXY, "diff", "--from-daemon",
                        METRICS_URL.removesuffix("/metrics"), check=False)  # fmt: skip
    assert (daemon.returncode, daemon.stdout) == (res.returncode, res.stdout), daemon.stderr
    pod = world.pods[0]
    world.exec(world.node, "ipvsadm", "-d", "-t", "10.96.7.20:80", "-r", f"{pod.ip}:8080")
    res = world.exec(world.node, *args, check=False)
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    block = lines[lines.index("service t/dif:") :]
    assert "  IPVS virtual server -t 10.96.7.20:80" in block
    assert f"    - -a -t 10.96.7.20:80 -r {pod.ip}:8080 -w 1" in block
    proxy.remove("dif")


def test_status_counts_every_connection(world: World, proxy: Pyproxy) -> None:
    """``pyproxy status --mode ipvs``: the kernel's counters per virtual and real server grow
    by exactly the connections made; so do the daemon's per-service count (/debug/traffic,
    status --from-daemon) and ``pyproxy_service_connections_total``."""
    proxy.write("cnt", *manifest_objects(world, svc("cnt", "10.96.7.21", [HTTP]),
                                         pods(world, 1, 2), HTTP_EP))  # fmt: skip
    reachable(world, "10.96.7.21")

    def counts() -> tuple[int, ...]:
        base = METRICS_URL.removesuffix("/metrics")
        doc = json.loads(world.exec(world.node, PYPROXY, "status", "--from-daemon", base, "-o",
                                    "json").stdout)  # fmt: skip
        (vs,) = [v for v in doc["ipvs"] if (v["address"], v["port"]) == ("10.96.7.21", 80)]
        labels = '{namespace="t",port="http",service="cnt"}'
        exported = metric(scrape(world), "pyproxy_service_connections_total", labels)
        return (vs["connections"], sum(r["connections"] for r in vs["realServers"]),
                doc["traffic"]["t/cnt:http"]["connections"], int(exported))  # fmt: skip

    def agreed() -> tuple[int, ...]:
        # IPVS's statistics reach netlink through its estimator: the daemon and the tool
        # read a moment apart agree once it has run.
        def same() -> tuple[int, ...] | None:
            c = counts()
            return c if len(set(c)) == 1 else None

        result: tuple[int, ...] = wait_for(same, what="the daemon's and the kernel's counts")
        return result

    before = agreed()
    r = world.probe("tcp", "10.96.7.21", 80, count=30)
    assert total(r) == 30
    after = agreed()
    assert tuple(a - b for a, b in zip(after, before, strict=True)) == (30, 30, 30, 30), (
        before, after)  # fmt: skip
    text = world.exec(world.node, PYPROXY, "status", "--mode", "ipvs").stdout
    assert any(ln.split()[:2] == ["TCP", "10.96.7.21:80"] for ln in text.splitlines()), text
    proxy.remove("cnt")


def test_metric_families_are_the_modes_own(world: World, proxy: Pyproxy) -> None:
    proxy.write(
        "mf", *manifest_objects(world, svc("mf", "10.96.7.9", [HTTP]), pods(world, 1), HTTP_EP)
    )
    reachable(world, "10.96.7.9")
    fam = '{ip_family="IPv4"}'
    text = wait_for(lambda: get(world, METRICS_URL)["code"] == 200 and scrape(world))
    check_mode_families(text, "ipvs")
    vs = metric(text, "pyproxy_ipvs_virtual_servers", fam)
    assert vs >= 1 and metric(text, "pyproxy_ipvs_real_servers", fam) >= 1
    proxy.remove("mf")
    wait_for(
        lambda: metric(scrape(world), "pyproxy_ipvs_virtual_servers", fam) == vs - 1,
        timeout=30,
        what="the virtual server count to drop",
    )


def test_trace_predicts_real_connections(world: World, proxy: Pyproxy) -> None:
    """tests/netns/test_trace.py's cases on real IPVS: what trace says each client reaches (or
    that it is dropped or refused) is what its connections do."""
    check_predictions(world, proxy, trace_cases.IPVS)


def test_service_addresses_do_not_reach_host_services(world: World, proxy: Pyproxy) -> None:
    """Every service address is on kube-ipvs0, so without upstream's last KUBE-IPVS-FILTER
    rule (kubernetes#72236) it would reach the node's own services: a client is refused on
    any port of a service address that is not a service port, and trace says so."""
    proxy.write("vip", *manifest_objects(world, svc("vip", "10.96.7.31", [HTTP]),
                                         pods(world, 1), HTTP_EP))  # fmt: skip
    reachable(world, "10.96.7.31")
    host = world.spawn(world.node, PYTHON, str(HERE / "echo.py"), "--name", "host", "--tcp",
                       "9999", "--udp", "9998")  # fmt: skip
    try:
        assert host.stdout is not None and host.stdout.readline().strip() == "ready"
        assert world.probe("tcp", NODE_CLIENT_IP, 9999)["replies"] == {"host": 1}
        r = world.probe("tcp", "10.96.7.31", 9999, count=3, timeout=1.0)
        assert r["errors"] == {"refused": 3} and not r["replies"], r
        doc = trace_cases.trace(world, proxy, world.client_ip(0), "10.96.7.31:9999")
        assert [o["verdict"] for o in doc["outcomes"]] == ["reject"], doc
        assert doc["outcomes"][0]["steps"][-1] == (
            "-t filter -A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set "
            "KUBE-IPVS-IPS dst -j REJECT")  # fmt: skip
    finally:
        world.stop(host)
    proxy.remove("vip")


def test_unknown_scheduler_is_a_clear_error(world: World) -> None:
    res = world.exec(
        world.node,
        PYPROXY,
        "--mode=ipvs",
        "--ipvs-scheduler=nosuch",
        "--manifests=/tmp",
        check=False,
    )
    assert res.returncode != 0
    assert "--ipvs-scheduler: 'nosuch' is not one of" in res.stderr
    assert "Traceback" not in res.stderr


def test_cleanup_removes_everything_pyproxy_made(
    world: World, proxy: Pyproxy, tmp_path: Path
) -> None:
    # something that is not pyproxy's: a virtual server on another address, an ipset
    world.exec(world.node, "ipvsadm", "-A", "-t", "192.0.2.1:80", "-s", "rr")
    world.exec(world.node, "ipset", "create", "USER-SET", "hash:ip")
    proxy.stop()
    res = world.exec(world.node, PYPROXY, "cleanup", "--mode=ipvs")
    assert res.returncode == 0, res.stderr
    listing = ipvsadm(world)
    assert "10.96.7." not in listing and "192.0.2.1:80" in listing
    sets = world.exec(world.node, "ipset", "list", "-n").stdout.split()
    assert sets == ["USER-SET"]
    links = world.exec(world.node, "ip", "-br", "link").stdout
    assert "kube-ipvs0" not in links
    assert "KUBE-" not in world.exec(world.node, "iptables-legacy-save").stdout
    assert "KUBE-" not in world.exec(world.node, "ip6tables-legacy-save").stdout
    assert "fd00:96::" not in listing
