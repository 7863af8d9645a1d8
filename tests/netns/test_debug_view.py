"""The daemon's own view over HTTP (on the metrics address) and on SIGUSR1, in each mode that
runs here: /debug/state shows the model with the service's real addresses, /debug/rules the
transaction that programmed it, /debug/explain the endpoints' reasons."""

from __future__ import annotations

import json
import re
import signal
from typing import Any

import pytest

from tests.netns.scrape import get
from tests.netns.services import HTTP, HTTP_EP, pods, reachable, svc
from tests.netns.world import (
    CLUSTER_CIDR,
    CLUSTER_CIDR6,
    PYPROXY,
    Pyproxy,
    World,
    manifest_objects,
    wait_for,
)

pytestmark = pytest.mark.netns
PYPROXY_MODES = ("iptables", "nftables", "userspace")
PYPROXY_FLAGS = ("--metrics-bind-address", "127.0.0.1:10249")
BASE = "http://127.0.0.1:10249"
IP = "10.96.43.1"


def debug(world: World, path: str) -> dict[str, Any]:
    r = get(world, BASE + path)
    assert r["code"] == 200, r
    return dict(json.loads(r["body"]))


def mentions(text: str, ip: str) -> bool:
    """The whole address appears (10.96.43.1 is not in 10.96.43.10)."""
    return re.search(rf"(?<![\d.]){re.escape(ip)}(?![\d])", text) is not None


def test_state_rules_and_explain_show_the_service(world: World, proxy: Pyproxy) -> None:
    proxy.write("dbg", *manifest_objects(world, svc("dbg", IP, [{**HTTP, "nodePort": 30243}],
                                                    type="NodePort"),
                                         pods(world, 1, 2), HTTP_EP))  # fmt: skip
    reachable(world, IP)
    state = wait_for(lambda: (d := debug(world, "/debug/state"))["services"].get("t/dbg") and d,
                     what="the service in /debug/state")  # fmt: skip
    assert state["mode"] == proxy.mode and state["lastSync"]["ok"] is True
    (port,) = state["services"]["t/dbg"]
    assert port["name"] == "t/dbg:http" and port["protocol"] == "TCP" and port["port"] == 80
    assert port["cluster_ips"] == [IP]
    assert {ep["ip"] for ep in port["endpoints"]} == {world.pods[0].ip, world.pods[1].ip}
    assert all(ep["ready"] for ep in port["endpoints"])

    applied = debug(world, "/debug/rules")["lastApplied"]
    (added,) = [t for t in applied if mentions(t["text"], IP)]  # the IPv4 transaction
    tool = {"nftables": "IPv4 nftables transaction"}.get(proxy.mode, "iptables-restore")
    assert added["what"].startswith("IPv4") and added["what"].endswith(tool), added

    r = get(world, f"{BASE}/debug/explain?service=t/dbg")
    assert r["code"] == 200
    lines = r["body"].splitlines()
    for pod in (world.pods[0], world.pods[1]):
        assert any(ln.split()[:1] == [f"{pod.ip}:8080"] and ln.endswith(": used") for ln in lines)
    assert get(world, f"{BASE}/debug/explain")["code"] == 400
    cli = world.exec(world.node, PYPROXY, "explain", "t/dbg", "--from-daemon", BASE)
    assert cli.stdout == r["body"]
    (doc,) = json.loads(world.exec(world.node, PYPROXY, "explain", "t/dbg", "--from-daemon",
                                   BASE, "-o", "json").stdout)  # fmt: skip
    assert {e["endpoint"]: e["reason"] for e in doc["endpoints"]} == {
        f"{world.pods[0].ip}:8080": "used", f"{world.pods[1].ip}:8080": "used"}  # fmt: skip
    # The daemon's paths are the offline explain's, NodePort included (the daemon adds this
    # node's addresses to its state as the CLI does).
    offline = json.loads(world.exec(
        world.node, PYPROXY, "explain", "t/dbg", "--mode", proxy.mode, "--manifests",
        str(proxy.manifests), "--hostname-override", "node-a", "--cluster-cidr",
        f"{CLUSTER_CIDR},{CLUSTER_CIDR6}", "-o", "json").stdout)  # fmt: skip
    assert [p["to"].split()[0] for p in doc["paths"]] == ["cluster", "cluster", "NodePort"]
    assert offline == [doc]

    # pyproxy status in every mode: the daemon's own view, then counters where the mode has them.
    lines = world.exec(world.node, PYPROXY, "status", "--from-daemon", BASE).stdout.splitlines()
    assert lines[0] == f"mode: {proxy.mode}   node: node-a"
    assert lines[1].startswith("last sync: ") and lines[1].endswith(", ok")
    assert lines[3] == "pending: 0 service, 0 endpoint changes"
    services = debug(world, "/debug/state")["services"]
    ports = sum(len(p) for p in services.values())
    eps = sum(len(p["endpoints"]) for ps in services.values() for p in ps)
    assert lines[4] == f"services: {len(services)}   service ports: {ports}   endpoints: {eps}"
    doc = json.loads(world.exec(world.node, PYPROXY, "status", "--from-daemon", BASE, "-o",
                                "json").stdout)  # fmt: skip
    assert doc["daemon"]["mode"] == proxy.mode
    if proxy.mode == "iptables":
        assert set(doc["counters"]["t/dbg:http"]["endpoints"]) == {
            f"{world.pods[0].ip}:8080", f"{world.pods[1].ip}:8080"}  # fmt: skip

    proxy.remove("dbg")
    wait_for(lambda: "t/dbg" not in debug(world, "/debug/state")["services"],
             what="the service to leave /debug/state")  # fmt: skip
    wait_for(  # the removal is a newer transaction through the same tool and family
        lambda: [t for t in debug(world, "/debug/rules")["lastApplied"]
                 if t["at"] > added["at"] and t["what"] == added["what"]],
        what="the removal's transaction")  # fmt: skip


def test_sigusr1_writes_the_dump_to_the_log(world: World, proxy: Pyproxy) -> None:
    proxy.write("usr1", *manifest_objects(world, svc("usr1", "10.96.43.2", [HTTP]),
                                          pods(world, 3), HTTP_EP))  # fmt: skip
    reachable(world, "10.96.43.2")
    assert proxy.proc is not None
    start = len(proxy.log.read_text())
    proxy.proc.send_signal(signal.SIGUSR1)
    marker = "state and rules (SIGUSR1):\n"
    text = wait_for(lambda: marker in proxy.log.read_text()[start:] and proxy.log.read_text(),
                    what="the SIGUSR1 dump")[start:]  # fmt: skip
    body = text.split(marker, 1)[1]
    dump = json.JSONDecoder().raw_decode(body)[0]
    assert dump["state"]["services"]["t/usr1"][0]["cluster_ips"] == ["10.96.43.2"]
    assert dump["rules"]["lastApplied"] != []
    assert proxy.proc.poll() is None
    proxy.remove("usr1")
