r"""A two-node cluster out of namespaces: node-a and node-b joined by a bridge namespace, pods
behind each node, and clients on the bridge LAN whose default route is one of the nodes.

  clients 172.30.0.101-.104 -- br0 (namespace "br") -- node-a 172.30.0.11: pods 10.244.{1,3}.2
                                                    \-- node-b 172.30.0.12: pods 10.244.{2,4}.2
Nodes route each other's pod subnets, as a CNI would. Every address lives in these
namespaces; ``close()`` removes all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.netns.world import HERE, PYTHON, World, sh

NODES = {"node-a": "172.30.0.11", "node-b": "172.30.0.12"}
PODS = {  # name: (node, subnet index)
    "pod-a1": ("node-a", 1),
    "pod-a2": ("node-a", 3),
    "pod-b1": ("node-b", 2),
    "pod-b2": ("node-b", 4),
}
CLIENTS = {  # name: (address, node it routes through)
    "c-a-in": ("172.30.0.101", "node-a"),
    "c-a-out": ("172.30.0.102", "node-a"),
    "c-b-in": ("172.30.0.103", "node-b"),
    "c-b-out": ("172.30.0.104", "node-b"),
}


@dataclass
class MultiNode(World):
    node_ns: dict[str, str] = field(default_factory=dict)
    pod_ns: dict[str, str] = field(default_factory=dict)
    client_ns: dict[str, str] = field(default_factory=dict)

    def ns(self, name: str) -> str:
        return f"pp{self.tag}-{name}"

    def build_cluster(self) -> MultiNode:
        try:
            br = self.ns("br")
            self._add_ns(br)
            sh("ip", "-n", br, "link", "add", "br0", "type", "bridge")
            sh("ip", "-n", br, "link", "set", "br0", "up")
            for i, (node, ip) in enumerate(NODES.items()):
                ns = self.ns(node)
                self._add_ns(ns)
                self.node_ns[node] = ns
                self.veth(br, f"n{i}", ns, [f"{ip}/24"], master="br0", gateways=["172.30.0.254"])
                for key in ("net.ipv4.ip_forward=1", "net.ipv4.icmp_ratelimit=0"):
                    self.exec(ns, "sysctl", "-qw", key)
            for i, (client, (ip, via)) in enumerate(CLIENTS.items()):
                ns = self.ns(client)
                self._add_ns(ns)
                self.client_ns[client] = ns
                self.veth(br, f"c{i}", ns, [f"{ip}/24"], master="br0", gateways=[NODES[via]])
            for pod, (node, idx) in PODS.items():
                ns = self.ns(pod)
                self._add_ns(ns)
                self.pod_ns[pod] = ns
                self.veth(
                    self.node_ns[node],
                    f"p{idx}",
                    ns,
                    [f"10.244.{idx}.2/24"],
                    host_addrs=[f"10.244.{idx}.1/24"],
                    gateways=[f"10.244.{idx}.1"],
                )
                for other in NODES:
                    if other != node:
                        sh(
                            "ip",
                            "-n",
                            self.node_ns[other],
                            "route",
                            "add",
                            f"10.244.{idx}.0/24",
                            "via",
                            NODES[node],
                        )
                p = self.spawn(ns, PYTHON, str(HERE / "echo.py"), "--name", pod)
                assert p.stdout is not None
                if p.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"echo server in {pod} did not start")
        except BaseException:
            self.close()
            raise
        return self


def pod_ip(pod: str) -> str:
    return f"10.244.{PODS[pod][1]}.2"
