"""The real cluster's smoke test: two nodes with kubelets and containerd become Ready, pyproxy's
DaemonSet (deploy/, pyproxy's own image, pulled from nowhere) runs one pod per node, and in
iptables, nftables and ebpf mode a pod on node-a reaches a ClusterIP whose only endpoint is a
pod on node-b (in ebpf mode connected to the pod at its socket: no flow to the ClusterIP in
node-a's conntrack), and node-a's namespace reaches that Service's NodePort on both nodes'
addresses. The Service asks for both families (PreferDualStack): in the dual-stack cluster
``make real-smoke`` brings up, each check runs over IPv4 and over IPv6 (the Service's two
ClusterIPs, each node's two addresses), and the test fails if the Service got only one.
(test_teardown.py checks that ``down`` leaves the machine as it was.)"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from tests.cluster import family, host, real
from tests.realcluster import kernel, objects


@pytest.fixture(scope="module")
def service(cluster: dict[str, str]) -> dict[str, Any]:
    objects.apply_ready(
        objects.pod("server", "node-b", ["netexec", "--http-port=8080"], {"app": "smoke"}),
        objects.pod("client", "node-a", ["pause"]),
        objects.nodeport("smoke", "smoke"),
    )
    svc = real.get("service", "smoke")
    server = real.get("pod", "server")
    assert server["spec"]["nodeName"] == "node-b"

    # The EndpointSlices (one per family) name exactly the server pod, ready.
    def endpoints() -> list[tuple[list[str], bool]]:
        slices = real.get("endpointslices", "-l", "kubernetes.io/service-name=smoke")["items"]
        return sorted(
            (e["addresses"], e["conditions"].get("ready"))
            for s in slices
            for e in s.get("endpoints") or []
        )

    pod_ips = [ip["ip"] for ip in server["status"]["podIPs"]]
    assert len(pod_ips) == len(family.stacks(real.family())), pod_ips
    real.wait(
        lambda: endpoints() == sorted(([ip], True) for ip in pod_ips),
        "the EndpointSlices of smoke",
        60,
    )
    want = len(family.stacks(real.family()))
    assert len(svc["spec"]["clusterIPs"]) == want, svc["spec"]
    return {
        "clusterIP": svc["spec"]["clusterIP"],
        "clusterIPs": svc["spec"]["clusterIPs"],
        "nodePort": svc["spec"]["ports"][0]["nodePort"],
    }


def test_nodes_ready_and_pyproxy_on_every_node(cluster: dict[str, str]) -> None:
    assert real.nodes_ready()
    # The kubelets wrote their host-wide sysctls, and the writes went to the cluster's masks
    # (test_teardown.py checks that the machine's values did not move).
    assert host.masked_values(real.STATE) == host.MASKED_SYSCTLS
    pods = real.proxy_pods("pyproxy")
    assert set(pods) == {"node-a", "node-b"}
    for p in pods.values():
        (status,) = p["status"]["containerStatuses"]
        assert status["image"] == "docker.io/library/pyproxy:0.1.0"
        assert status["ready"] is True


def _http(url_from: str, url: str) -> str:
    """One bounded HTTP GET, from a pod (``pod/NAME``) or a node's namespace (``node-X``)."""
    curl = ["curl", "-s", "--connect-timeout", "2", "--max-time", "5", url]
    if url_from.startswith("pod/"):
        return real.kubectl("exec", url_from[4:], "--", *curl, check=False, timeout=30)
    res = subprocess.run(
        ["nsenter", f"--net=/run/netns/{host.PREFIX}{url_from}", *curl],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return res.stdout


@pytest.mark.parametrize("mode", ["iptables", "nftables", "ebpf"])
def test_pod_to_clusterip_and_node_to_nodeport_across_nodes(
    mode: str, service: dict[str, Any]
) -> None:
    real.use_proxy("pyproxy", mode)
    # Ready is not yet synced (pyproxy is healthy while it starts, as upstream): wait for the
    # mode's own objects, and no other mode's, in both nodes' kernels, then send traffic.
    for node in ("node-a", "node-b"):
        real.wait(lambda node=node: kernel.serves_in(node, mode), f"{node} in {mode} mode", 60)
    np = service["nodePort"]
    # netexec's /hostname answers the pod's name: the whole answer must be "server".
    for cip in service["clusterIPs"]:
        url = f"http://{family.url_host(cip)}:80/hostname"
        real.wait(
            lambda url=url: _http("pod/client", url) == "server", f"{mode}: client -> {url}", 90
        )
    if mode == "ebpf":
        _balanced_at_the_socket(service["clusterIP"])
    for n in real.nodes():
        for address in n.addresses:
            url = f"http://{family.url_host(address)}:{np}/hostname"
            real.wait(
                lambda url=url: _http("node-a", url) == "server", f"{mode}: node-a -> {url}", 60
            )


def _balanced_at_the_socket(cip: str) -> None:
    """In ebpf mode the client's connection leaves its socket addressed to the server pod: the
    flow node-a's conntrack records was sent to the pod's address and port, never to the
    ClusterIP (in the other modes it is the ClusterIP's, translated by a rule)."""
    client = real.get("pod", "client")["status"]["podIP"]
    server = real.get("pod", "server")["status"]["podIP"]
    match = ("-f", "ipv6" if ":" in client else "ipv4", "-p", "tcp", "-s", client)
    kernel.conntrack_delete("node-a", *match)
    assert _http("pod/client", f"http://{family.url_host(cip)}:80/hostname") == "server"
    assert kernel.conntrack("node-a", *match) == [(server, "8080")]
