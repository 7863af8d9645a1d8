"""``pyproxy trace`` predicts what real connections do: for services covering ClusterIP,
NodePort, LoadBalancer with source ranges, both traffic policies, session affinity and no
endpoints, the endpoints trace says a client can reach (or that it is rejected or dropped, and
whether its source is kept) are exactly what that client's real connections reach."""

from __future__ import annotations

import re

import pytest

from tests.netns.services import pods, reachable
from tests.netns.trace_cases import LB_IP, USERSPACE, check_predictions, objects
from tests.netns.world import PYPROXY, Pyproxy, World

pytestmark = pytest.mark.netns
PYPROXY_MODES = ("iptables", "nftables", "userspace")


def test_trace_predicts_real_connections(world: World, proxy: Pyproxy) -> None:
    check_predictions(world, proxy, USERSPACE if proxy.mode == "userspace" else {})


def test_trace_text_names_the_rules_matched(world: World, proxy: Pyproxy) -> None:
    proxy.write("trace", *objects(world))
    reachable(world, "10.96.50.1")
    res = world.exec(
        world.node, PYPROXY, "trace", "--mode", proxy.mode, "--manifests", str(proxy.manifests),
        "--hostname-override", "node-a", "--from", world.client_ip(1), "--to", f"{LB_IP}:80",
    )  # fmt: skip
    lines = res.stdout.splitlines()
    assert lines[0] == f"TCP {world.client_ip(1)} -> {LB_IP}:80 ({proxy.mode} mode)"
    if proxy.mode == "userspace":  # no source ranges here: relayed, round robin
        redirect = re.compile(r'  -t nat -A KUBE-PORTALS-CONTAINER -m comment --comment '
                              rf't/tr-lb:http -m tcp -p tcp -d {re.escape(LB_IP)} --dport 80 '
                              r"-j REDIRECT --to-ports <listener:t/tr-lb:http/TCP>")  # fmt: skip
        assert len([ln for ln in lines if redirect.fullmatch(ln)]) == 1, lines
        for pod in pods(world, 1, 2):
            assert f"  => 50.0%: relayed to {pod.ip}:8080, from the node's address" in lines
        assert "  relay t/tr-lb:http: round robin over 2 endpoint(s)" in lines
        proxy.remove("trace")
        return
    assert "  => 100.0%: DROPPED (silently)" in lines
    if proxy.mode == "nftables":
        rule = re.compile(r"       chain firewall-[A-Z2-7]{8}-t/tr-lb/tcp/http: ip saddr != "
                          + re.escape(f"{{ {world.client_ip(0)}/32 }} drop"))  # fmt: skip
        assert len([ln for ln in lines if rule.fullmatch(ln)]) == 1, lines
    else:
        drop = [ln for ln in lines if ln.startswith("       -t filter -A KUBE-PROXY-FIREWALL ")]
        assert len(drop) == 1 and drop[0].endswith(f"-d {LB_IP} --dport 80 -j DROP"), lines
    proxy.remove("trace")
