"""Conformance beside upstream, in iptables and in nftables mode: upstream kube-proxy on node-b
and pyproxy on node-a, in the same mode, against the same Services of one real cluster. For
every source (a client allowed by source ranges, one that is not, a pod on the node, the node
itself) x every service address (cluster IP, the node's NodePort, external IP, load-balancer
IP) x port, TCP and UDP, the outcome seen through node-a must equal the one seen through
node-b.

Outcomes are written relative to the node that handled the traffic ("2 local + 2 remote
pods", "source kept", "refused", "timeout"), so the two nodes are comparable. Where they
differ, pyproxy is wrong unless upstream's documentation says otherwise.

In nftables mode the rule set itself is compared too: upstream kube-proxy run for node-a in a
namespace of its own writes a ``kube-proxy`` table that, normalized (element order, handles,
counters), must be pyproxy's, object for object.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.cluster import KUBE_PROXY_TOKEN, PYPROXY_TOKEN, Cluster, binary
from tests.cluster.nsrelay import Relay
from tests.e2e.conftest import in_ns_kubeconfig, require_local
from tests.e2e.kube import Kube, eventually
from tests.e2e.multinode import CLIENTS, NODES, PODS, MultiNode, pod_ip
from tests.netns.nft_compare import table as nft_table
from tests.netns.world import PYPROXY, Pyproxy, sh

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
def relays(mn: MultiNode, cluster: Cluster, kube: Kube) -> Iterator[list[Relay]]:
    require_local(cluster)
    if binary("kube-proxy") is None:
        pytest.skip("upstream kube-proxy binary not built: run `make e2e`")
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
    try:
        yield relays
    finally:
        for r in relays:
            r.close()


def upstream_command(cluster: Cluster, d: Path, mode: str, node: str) -> list[str]:
    return [
        str(binary("kube-proxy")),
        f"--kubeconfig={in_ns_kubeconfig(cluster, KUBE_PROXY_TOKEN, d / 'kp.kubeconfig')}",
        f"--proxy-mode={mode}",
        f"--hostname-override={node}",
        "--cluster-cidr=10.244.0.0/16",
        "--conntrack-max-per-core=0",
        "--conntrack-tcp-timeout-established=0",
        "--conntrack-tcp-timeout-close-wait=0",
        "--metrics-bind-address=127.0.0.1:10249",
        "--healthz-bind-address=127.0.0.1:10256",
        "--iptables-min-sync-period=1s",  # also nftables mode's (upstream's options.go)
        "--v=2",
    ]


@pytest.fixture(scope="module", params=["iptables", "nftables"])
def proxies(
    request: pytest.FixtureRequest,
    mn: MultiNode,
    cluster: Cluster,
    relays: list[Relay],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    mode = str(request.param)
    d = tmp_path_factory.mktemp(f"conformance-{mode}")
    ours = Pyproxy(
        mn,
        None,
        d / "pyproxy.log",
        mode=mode,
        kubeconfig=in_ns_kubeconfig(cluster, PYPROXY_TOKEN, d / "pyproxy.kubeconfig"),
        node="node-a",
        ns=mn.node_ns["node-a"],
    ).start()
    upstream_log = (d / "kube-proxy.log").open("a")
    upstream = mn.spawn(
        mn.node_ns["node-b"],
        *upstream_command(cluster, d, mode, "node-b"),
        stdout=upstream_log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield {"pyproxy": ours, "kube-proxy": upstream, "dir": d, "mode": mode}
    finally:
        ours.stop()
        mn.stop(upstream)
        # The next mode starts from clean nodes, as after a reboot.
        mn.exec(mn.node_ns["node-a"], PYPROXY, "cleanup", f"--mode={mode}", check=False)
        mn.exec(mn.node_ns["node-b"], str(binary("kube-proxy")), "--cleanup", check=False)
        for ns in (mn.node_ns["node-a"], mn.node_ns["node-b"]):
            mn.exec(ns, "conntrack", "-F", check=False)
        for name in ("pyproxy.log", "kube-proxy.log"):
            p = d / name
            if p.exists():
                print(f"--- {name} tail ---\n" + "\n".join(p.read_text().splitlines()[-15:]))


@pytest.fixture(scope="module")
def workload(mn: MultiNode, kube: Kube, relays: list[Relay]) -> None:
    """The scenarios' Services and pods, made once for both modes."""
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
    mn: MultiNode, kube: Kube, workload: None, proxies: dict[str, Any]
) -> None:
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
    Path(proxies["dir"] / f"matrix-{proxies['mode']}.txt").write_text(
        "\n".join(f"{k}: {v}" for k, v in sorted(ours.items()))
    )
    assert not diff, "pyproxy and upstream kube-proxy differ:\n" + report


@contextmanager
def twin(mn: MultiNode, cluster: Cluster, name: str) -> Iterator[str]:
    """A bare namespace that reaches the API server: where a proxy for node-a writes its table
    without touching node-a's own."""
    ns = mn.ns(name)
    sh("ip", "netns", "add", ns)
    mn.namespaces.append(ns)
    relay = None
    try:
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        relay = Relay(ns, 6443, ("127.0.0.1", cluster.api_port))
        yield ns
    finally:
        if relay is not None:
            relay.close()
        sh("ip", "netns", "del", ns, check=False)
        mn.namespaces.remove(ns)


def service_ips(mn: MultiNode, ns: str) -> int:
    return len(nft_table(mn, ns).get("map service-ips", {}).get("elements", []))


def test_nftables_table_equals_upstreams(
    mn: MultiNode, cluster: Cluster, kube: Kube, workload: None, tmp_path: Path
) -> None:
    """pyproxy --mode=nftables and upstream kube-proxy --proxy-mode=nftables, both for node-a,
    each in a namespace of its own: the same ``ip kube-proxy`` table."""
    require_local(cluster)
    with twin(mn, cluster, "nft-ours") as ns_ours, twin(mn, cluster, "nft-theirs") as ns_theirs:
        ours = Pyproxy(
            mn,
            None,
            tmp_path / "pyproxy.log",
            mode="nftables",
            kubeconfig=in_ns_kubeconfig(cluster, PYPROXY_TOKEN, tmp_path / "pyproxy.kubeconfig"),
            node="node-a",
            ns=ns_ours,
        ).start()
        theirs = mn.spawn(
            ns_theirs,
            *upstream_command(cluster, tmp_path, "nftables", "node-a"),
            stdout=(tmp_path / "kube-proxy.log").open("a"),
            stderr=subprocess.STDOUT,
        )
        try:
            want = sum(len(ports) for _, ports, *_ in SCENARIOS)  # ... and `kubernetes`
            for ns in (ns_ours, ns_theirs):
                eventually(lambda n=ns: service_ips(mn, n) > want, timeout=60,
                           what=f"the services in {ns}'s table")  # fmt: skip
            # Both settle (each past its min-sync-period, nothing pending) on the same table;
            # a table that never matches fails below with the difference.
            with contextlib.suppress(AssertionError):
                eventually(lambda: nft_table(mn, ns_ours) == nft_table(mn, ns_theirs),
                           timeout=30, what="the two tables to agree")  # fmt: skip
            got, expected = nft_table(mn, ns_ours), nft_table(mn, ns_theirs)
        finally:
            ours.stop()
            mn.stop(theirs)
            for name in ("pyproxy.log", "kube-proxy.log"):
                print(f"--- {name} tail ---\n" + "\n".join(
                    (tmp_path / name).read_text().splitlines()[-15:]))  # fmt: skip
    report = [f"only pyproxy: {k}" for k in sorted(got.keys() - expected.keys())]
    report += [f"only upstream: {k}" for k in sorted(expected.keys() - got.keys())]
    for k in sorted(got.keys() & expected.keys()):
        if got[k] != expected[k]:
            report.append(f"{k}:\n  pyproxy:  {got[k]}\n  upstream: {expected[k]}")
    assert not report, "the nftables tables differ:\n" + "\n".join(report)
    assert len(got) > 30  # chains, sets and maps of every scenario
