"""LoadBalancer Services as a bare-metal cluster serves them: MetalLB (layer 2) gives a
Service an address of each family on the nodes' own network and one node answers ARP and
neighbour solicitations for it; the lan namespace, outside the cluster, connects to that
address, and the announcing node's proxy takes the packet to the pod. In iptables, nftables
and ebpf mode, over each family the cluster has:

- ``externalTrafficPolicy: Cluster``: the lan reaches the pod on node-b whichever node
  MetalLB chose;
- ``externalTrafficPolicy: Local``: MetalLB announces from node-b (the node with the
  endpoint), and the pod sees the client's own address, outside the nodes' network (the
  proxy does not masquerade a Local Service's external traffic).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster import family, metallb, real
from tests.realcluster import kernel, objects
from tests.realcluster.test_smoke import _http

pytestmark = pytest.mark.skipif(
    not all((real.IMAGES / f"{a}.tar").exists() for a in metallb.ARCHIVES),
    reason="MetalLB not built (make real-build builds it)",
)


def _in_pool(ip: str) -> bool:
    a = ipaddress.ip_address(ip)
    for s in family.stacks(real.family()):
        lo, hi = map(ipaddress.ip_address, s.lb_range)
        if a.version == lo.version and lo <= a <= hi:
            return True
    return False


def _loadbalancer(name: str, policy: str) -> dict[str, Any]:
    svc = objects.nodeport(name, "lb")
    svc["spec"]["type"] = "LoadBalancer"
    svc["spec"]["externalTrafficPolicy"] = policy
    return svc


@pytest.fixture(scope="module")
def ingress(cluster: dict[str, str]) -> Iterator[dict[str, list[str]]]:
    metallb.install()
    objects.apply_ready(
        objects.pod("lb-server", "node-b", ["netexec", "--http-port=8080"], {"app": "lb"}),
        _loadbalancer("lb-cluster", "Cluster"),
        _loadbalancer("lb-local", "Local"),
    )
    want = len(family.stacks(real.family()))

    def addresses(name: str) -> list[str]:
        ing = real.get("service", name)["status"].get("loadBalancer", {}).get("ingress") or []
        return [i["ip"] for i in ing] if len(ing) == want else []

    got = {
        n: real.wait(lambda n=n: addresses(n), f"{n}'s ingress", 60)
        for n in ("lb-cluster", "lb-local")
    }
    for ips in got.values():  # one address of each family, from MetalLB's pools on the lan
        assert all(_in_pool(ip) for ip in ips), ips
        assert len({ipaddress.ip_address(ip).version for ip in ips}) == want, ips
    yield got
    real.kubectl("delete", "service", "lb-cluster", "lb-local", "--ignore-not-found")
    real.kubectl("delete", "pod", "lb-server", "--ignore-not-found", "--wait=false")
    metallb.remove()


@pytest.mark.parametrize("mode", ["iptables", "nftables", "ebpf"])
def test_outside_client_reaches_loadbalancer(mode: str, ingress: dict[str, list[str]]) -> None:
    real.use_proxy("pyproxy", mode)
    for node in ("node-a", "node-b"):
        real.wait(lambda node=node: kernel.serves_in(node, mode), f"{node} in {mode} mode", 60)
    outside = {s.client_ip for s in family.stacks(real.family())}
    for ip in ingress["lb-cluster"]:
        url = f"http://{family.url_host(ip)}:80/hostname"
        real.wait(lambda url=url: _http("lan", url) == "lb-server", f"{mode}: lan -> {url}", 60)
    for ip in ingress["lb-local"]:
        url = f"http://{family.url_host(ip)}:80/clientip"
        # netexec answers "address:port" of the connection's peer: the lan's client address,
        # outside the nodes' network.
        seen = real.wait(lambda url=url: _http("lan", url), f"{mode}: lan -> {url}", 60)
        client = seen.rsplit(":", 1)[0].strip("[]")
        assert client in outside, (url, seen)
