"""`make demo`: pyproxy's main job, end to end, on one machine, with no cluster.

Builds a node namespace, three pod namespaces running echo servers and a client namespace;
runs pyproxy (iptables mode) on examples/ in the node namespace; sends a bounded number of
requests to the ClusterIP and the NodePort from the client; prints how they were spread
over the pods; then tears everything down (also on failure or Ctrl-C).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from tests.netns.world import NODE_CLIENT_IP, ROOT, Pyproxy, World, can_run, wait_for

REQUESTS = 300


def bar(n: int, total: int) -> str:
    return "#" * round(40 * n / total) if total else ""


def show(title: str, result: dict) -> None:
    total = sum(result["replies"].values())
    print(f"\n{title}: {total} answered, errors {result['errors'] or 'none'}")
    for pod in sorted(result["replies"]):
        n = result["replies"][pod]
        print(f"  {pod:6} {n:4d}  {bar(n, total)}")


def main() -> int:
    reason = can_run()
    if reason:
        print(f"demo: {reason}", file=sys.stderr)
        return 1
    world = World(f"d{os.getpid() % 1000}")
    with tempfile.TemporaryDirectory() as tmp:
        manifests = Path(tmp) / "manifests"
        manifests.mkdir()
        for f in (ROOT / "examples").glob("*.yaml"):
            (manifests / f.name).write_text(f.read_text())
        try:
            print("building namespaces: node, client, pod-1..3 (10.244.{1,2,3}.2)")
            world.build(pod_count=3, client_count=1)
            proxy = Pyproxy(world, manifests, Path(tmp) / "pyproxy.log").start()
            print("pyproxy --mode=iptables --manifests examples/ running in the node namespace")
            wait_for(
                lambda: world.probe("tcp", "10.96.0.10", 80, timeout=1)["replies"],
                timeout=30,
                what="the ClusterIP to answer",
            )
            show(
                f"TCP to ClusterIP 10.96.0.10:80 ({REQUESTS} connections)",
                world.probe("tcp", "10.96.0.10", 80, count=REQUESTS),
            )
            show(
                f"TCP to NodePort {NODE_CLIENT_IP}:30080 ({REQUESTS} connections)",
                world.probe("tcp", NODE_CLIENT_IP, 30080, count=REQUESTS),
            )
            show(
                "UDP to ClusterIP 10.96.0.10:53 (100 datagrams)",
                world.probe("udp", "10.96.0.10", 53, count=100),
            )
            proxy.stop()
            print("\nrules left programmed in the node namespace (KUBE-SERVICES):")
            for line in world.iptables_save("nat").splitlines():
                if line.startswith("-A KUBE-SERVICES"):
                    print("  " + line)
        finally:
            world.close()
            print("\nnamespaces removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
