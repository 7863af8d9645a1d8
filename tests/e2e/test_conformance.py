"""Conformance beside upstream: upstream kube-proxy (iptables mode) on node-b and pyproxy on
node-a, against the same Services of one real cluster. For every source (a client allowed by
source ranges, one that is not, a pod on the node, the node itself) x every service address
(cluster IP, the node's NodePort, external IP, load-balancer IP) x port, TCP and UDP, the
outcome seen through node-a must equal the one seen through node-b.

Outcomes are written relative to the node that handled the traffic ("2 local + 2 remote
pods", "source kept", "refused", "timeout"), so the two nodes are comparable. Where they
differ, pyproxy is wrong unless upstream's documentation says otherwise.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.cluster import KUBE_PROXY_TOKEN, PYPROXY_TOKEN, Cluster, binary
from tests.cluster.nsrelay import Relay
from tests.e2e.conftest import in_ns_kubeconfig, require_local
from tests.e2e.kube import Kube, eventually
from tests.e2e.multinode import CLIENTS, NODES, PODS, MultiNode, pod_ip
from tests.netns.world import Pyproxy

NS = "conf"
TCP = {"name": "tcp", "port": 80, "targetPort": 8080, "protocol": "TCP"}
UDP = {"name": "udp", "port": 53, "targetPort": 5353, "protocol": "UDP"}
ECHO = {"app": "echo"}
LB_IP = "203.0.113.50"
LB_LOCAL_IP = "203.0.113.51"
EXTERNAL_IP = "198.51.100.50"

# The scenarios: (name, ports, selector, spec, load-balancer ingress IP)
SCENARIOS: list[tuple[str, list[dict[str, Any]], dict[str, str], dict[str, Any], str | None]] = [
    ("cluster", [TCP, UDP], ECHO, {}, None),
    ("nodeport", [TCP, UDP], ECHO, {"type": "NodePort"}, None),
    ("nodeport-local", [TCP], ECHO, {"type": "NodePort", "externalTrafficPolicy": "Local"}, None),
    (
        "lb-ranges",
        [TCP],
        ECHO,
        {
            "type": "LoadBalancer",
            "loadBalancerSourceRanges": ["172.30.0.101/32", "172.30.0.103/32"],
        },
        LB_IP,
    ),
    (
        "lb-local",
        [TCP, UDP],
        ECHO,
        {"type": "LoadBalancer", "externalTrafficPolicy": "Local"},
        LB_LOCAL_IP,
    ),
    ("external-ip", [TCP, UDP], ECHO, {"externalIPs": [EXTERNAL_IP]}, None),
    ("internal-local", [TCP], ECHO, {"internalTrafficPolicy": "Local"}, None),
    ("affinity", [TCP], ECHO, {"sessionAffinity": "ClientIP"}, None),
    ("no-endpoints", [TCP, UDP], {"app": "nothing"}, {"type": "NodePort"}, None),
    ("terminating", [TCP], {"app": "term"}, {}, None),
]


@pytest.fixture(scope="module")
def mn() -> Iterator[MultiNode]:
    w = MultiNode(f"k{os.getpid() % 1000}").build_cluster()
    try:
        yield w
    finally:
        w.close()


@pytest.fixture(scope="module")
def proxies(
    mn: MultiNode, cluster: Cluster, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    require_local(cluster)
    if binary("kube-proxy") is None:
        pytest.skip("upstream kube-proxy binary not built: run `make e2e`")
    d = tmp_path_factory.mktemp("conformance")
    relays = [Relay(mn.node_ns[n], 6443, ("127.0.0.1", cluster.api_port)) for n in NODES]
    for node, ip in NODES.items():
        kube.node(node)
        kube.patch_status(
            f"/api/v1/nodes/{node}",
            {
                "addresses": [
                    {"type": "InternalIP", "address": ip},
                    {"type": "Hostname", "address": node},
                ]
            },
        )
    ours = Pyproxy(
        mn,
        None,
        d / "pyproxy.log",
        kubeconfig=in_ns_kubeconfig(cluster, PYPROXY_TOKEN, d / "pyproxy.kubeconfig"),
        node="node-a",
        ns=mn.node_ns["node-a"],
    ).start()
    ours.args = ours.args  # (started above)
    upstream_log = (d / "kube-proxy.log").open("a")
    upstream = mn.spawn(
        mn.node_ns["node-b"],
        str(binary("kube-proxy")),
        f"--kubeconfig={in_ns_kubeconfig(cluster, KUBE_PROXY_TOKEN, d / 'kp.kubeconfig')}",
        "--proxy-mode=iptables",
        "--hostname-override=node-b",
        "--cluster-cidr=10.244.0.0/16",
        "--conntrack-max-per-core=0",
        "--conntrack-tcp-timeout-established=0",
        "--conntrack-tcp-timeout-close-wait=0",
        "--metrics-bind-address=127.0.0.1:10249",
        "--healthz-bind-address=127.0.0.1:10256",
        "--iptables-min-sync-period=1s",
        "--v=2",
        stdout=upstream_log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield {"pyproxy": ours, "kube-proxy": upstream, "dir": d}
    finally:
        ours.stop()
        mn.stop(upstream)
        for r in relays:
            r.close()
        for name in ("pyproxy.log", "kube-proxy.log"):
            p = d / name
            if p.exists():
                print(f"--- {name} tail ---\n" + "\n".join(p.read_text().splitlines()[-15:]))


def probe(
    mn: MultiNode, ns: str, proto: str, host: str, port: int, count: int, timeout: float
) -> dict[str, Any]:
    return mn.probe(proto, host, port, count=count, timeout=timeout, ns=ns)


def node_addresses(node: str) -> set[str]:
    return {NODES[node]} | {f"10.244.{idx}.1" for n, idx in PODS.values() if n == node}


def outcome(
    mn: MultiNode, node: str, src_ns: str, src_ip: str, proto: str, host: str, port: int
) -> str:
    first = probe(mn, src_ns, proto, host, port, 1, 1.0)
    if not first["replies"]:
        again = probe(mn, src_ns, proto, host, port, 2, 1.0)
        errs = {**first["errors"]}
        for k, v in again["errors"].items():
            errs[k] = errs.get(k, 0) + v
        return "+".join(sorted(errs)) if not again["replies"] else "flaky"
    # 60 draws: the chance that one of 4 equally likely pods never answers is 4*(3/4)^60 ~ 1e-7.
    r = probe(mn, src_ns, proto, host, port, 60, 1.0)
    local = {p for p in r["replies"] if PODS[p][0] == node}
    remote = set(r["replies"]) - local
    seen = {ip for ips in r["sources"].values() for ip in ips}
    node_addrs = node_addresses(node)
    own = node_addrs if src_ns == mn.node_ns[node] else {src_ip}
    kinds = sorted(
        {"kept" if ip in own else "node" if ip in node_addrs else "other" for ip in seen}
    )
    src = "source-" + "+".join(kinds)
    errors = f" errors={sorted(r['errors'])}" if r["errors"] else ""
    return f"{len(local)} local + {len(remote)} remote, {src}{errors}"


def matrix(mn: MultiNode, kube: Kube, node: str) -> dict[tuple[str, ...], str]:
    node_ip = NODES[node]
    letter = node[-1]
    sources = {
        "client-allowed": (mn.client_ns[f"c-{letter}-in"], CLIENTS[f"c-{letter}-in"][0]),
        "client-other": (mn.client_ns[f"c-{letter}-out"], CLIENTS[f"c-{letter}-out"][0]),
        "pod": (mn.pod_ns[f"pod-{letter}1"], pod_ip(f"pod-{letter}1")),
        "node": (mn.node_ns[node], node_ip),
    }
    out: dict[tuple[str, ...], str] = {}
    for name, *_ in SCENARIOS:
        svc = kube.get_service(NS, name)
        for p in svc["spec"]["ports"]:
            proto = p["protocol"].lower()
            targets = [("cluster-ip", svc["spec"]["clusterIP"], p["port"])]
            if p.get("nodePort"):
                targets.append(("node-port", node_ip, p["nodePort"]))
            targets += [("external-ip", ip, p["port"]) for ip in svc["spec"].get("externalIPs", [])]
            for ing in svc.get("status", {}).get("loadBalancer", {}).get("ingress") or []:
                targets.append(("lb-ip", ing["ip"], p["port"]))
            for kind, host, port in targets:
                for src_name, (src_ns, src_ip) in sources.items():
                    cell = outcome(mn, node, src_ns, src_ip, proto, host, port)
                    if name == "affinity" and "local" in cell:
                        # Which pod the client is pinned to is random, and with it whether
                        # the reply is hairpinned: compare only that it is pinned.
                        n = sum(int(x) for x in cell.split(",")[0].split() if x.isdigit())
                        cell = "pinned to 1 pod" if n == 1 else f"{n} pods"
                    out[(name, proto, kind, src_name)] = cell
    return out


def test_reachability_matrix_matches_upstream(
    mn: MultiNode, kube: Kube, cluster: Cluster, proxies: dict[str, Any]
) -> None:
    kube.namespace(NS)
    for pod, (node, _) in PODS.items():
        kube.pod(NS, pod, node, pod_ip(pod), ECHO)
    for name, ports, selector, spec, lb_ip in SCENARIOS:
        kube.service(NS, name, ports, selector, **spec)
        if lb_ip:
            kube.patch_status(
                f"/api/v1/namespaces/{NS}/services/{name}",
                {"loadBalancer": {"ingress": [{"ip": lb_ip}]}},
            )
    # Terminating endpoints: pods still serving while being deleted (no kubelet finishes it).
    for pod in ("pod-a1", "pod-b1"):
        kube.pod(NS, f"term-{pod}", PODS[pod][0], pod_ip(pod), {"app": "term"})
    eventually(lambda: len(kube.ready_addresses(NS, "terminating")) == 2, what="term slices")
    for pod in ("pod-a1", "pod-b1"):
        kube.c.request("DELETE", f"/api/v1/namespaces/{NS}/pods/term-{pod}")
    eventually(lambda: not kube.ready_addresses(NS, "terminating"), what="terminating endpoints")
    ready = {pod_ip(p) for p in PODS}
    eventually(lambda: kube.ready_addresses(NS, "cluster") == ready, what="slices")
    # Both proxies have programmed everything: the last service answers through each node.
    for node in NODES:
        eventually(
            lambda n=node: (
                outcome(
                    mn,
                    n,
                    mn.node_ns[n],
                    NODES[n],
                    "tcp",
                    kube.get_service(NS, "terminating")["spec"]["clusterIP"],
                    80,
                )
                != "timeout+timeout"
            ),
            timeout=60,
            what=f"{node} to program the services",
        )

    ours = matrix(mn, kube, "node-a")
    theirs = matrix(mn, kube, "node-b")
    assert len(ours) > 60
    diff = {
        k: (ours.get(k), theirs.get(k))
        for k in ours.keys() | theirs.keys()
        if ours.get(k) != theirs.get(k)
    }
    report = "\n".join(f"{k}: pyproxy={a!r} kube-proxy={b!r}" for k, (a, b) in sorted(diff.items()))
    Path(proxies["dir"] / "matrix.txt").write_text(
        "\n".join(f"{k}: {v}" for k, v in sorted(ours.items()))
    )
    assert not diff, "pyproxy and upstream kube-proxy differ:\n" + report
