"""--nodeport-addresses primary: NodePorts answer on the address the Node object names as
its InternalIP, and on no other address of the node."""

from __future__ import annotations

import pytest

from tests.netns.services import HTTP, HTTP_EP, pods, reachable, svc
from tests.netns.world import NODE_CLIENT_IP, Pyproxy, World, manifest_objects, sh, total

pytestmark = pytest.mark.netns
PYPROXY_FLAGS = ("--nodeport-addresses", "primary")
PRIMARY = "172.31.0.100"


def test_node_port_only_on_the_primary_address(world: World, proxy: Pyproxy) -> None:
    sh("ip", "-n", world.node, "addr", "add", f"{PRIMARY}/24", "dev", "cbr")
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "node-a"},
        "status": {"addresses": [{"type": "InternalIP", "address": PRIMARY}]},
    }
    proxy.write(
        "np",
        node,
        *manifest_objects(
            world,
            svc("np", "10.96.9.1", [{**HTTP, "nodePort": 30091}], type="NodePort"),
            pods(world, 1, 2),
            HTTP_EP,
        ),
    )
    reachable(world, PRIMARY, 30091)
    assert total(world.probe("tcp", PRIMARY, 30091, count=20)) == 20
    other = world.probe("tcp", NODE_CLIENT_IP, 30091, count=3)
    assert total(other) == 0 and other["errors"] == {"refused": 3}
    # The service itself still answers on its cluster IP.
    assert total(world.probe("tcp", "10.96.9.1", 80, count=5)) == 5
