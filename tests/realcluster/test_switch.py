"""Switching a live cluster from upstream kube-proxy to pyproxy and back, as the README tells an
operator to: while a client pod on node-a sends about 20 requests a second to a ClusterIP and
to a NodePort on node-b whose endpoints are pods on both nodes,

1. kube-proxy (iptables) serves; pyproxy's DaemonSet is applied in the same mode, and once it
   is Ready on every node kube-proxy's DaemonSet is deleted (the chains are the same: nothing
   is left to clean up);
2. pyproxy is switched to nftables mode: after its first sync it removes the iptables mode's
   chains, its own and so kube-proxy's (upstream's platformCleanup does this at start);
3. pyproxy is switched back to iptables mode: its nftables table goes the same way;
4. kube-proxy's DaemonSet is applied again, and pyproxy's deleted once kube-proxy is Ready.

Every request is counted; the README shows the figure. The target is none failed, and the
test fails on any. After step 2 neither node holds an iptables chain of kube-proxy's, and at
the end neither holds pyproxy's nftables table.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest

from tests.cluster import host, real
from tests.realcluster import kernel, objects

MAX_ITERATIONS = 6000  # a bound on the client's loop: it stops by itself
DWELL = 15  # seconds of load before the first switch, after each, and after the last


def test_switch_kube_proxy_to_pyproxy_and_back_under_load(cluster: dict[str, str]) -> None:
    real.use_proxy("kube-proxy", "iptables")
    server = ["netexec", "--http-port=8080"]
    objects.apply_ready(
        objects.pod("switch-a", "node-a", server, {"app": "switch"}),
        objects.pod("switch-b", "node-b", server, {"app": "switch"}),
        objects.pod("switch-client", "node-a", ["pause"]),
        objects.nodeport("switch", "switch"),
    )
    svc = real.get("service", "switch")
    cip, np = svc["spec"]["clusterIP"], svc["spec"]["ports"][0]["nodePort"]
    node_b = real.nodes()[1].address
    urls = {"clusterIP": f"http://{cip}/hostname", "nodePort": f"http://{node_b}:{np}/hostname"}
    want = {"switch-a", "switch-b"}

    def both_answer() -> bool:
        seen = set()
        for _ in range(20):
            for url in urls.values():
                seen.add(
                    real.kubectl(
                        "exec",
                        "switch-client",
                        "--",
                        "curl",
                        "-s",
                        "--max-time",
                        "2",
                        url,
                        check=False,
                    )
                )
        return seen == want

    real.wait(both_answer, "both servers through both addresses", 60)
    # The client: a ClusterIP and a NodePort request about every 0.1 s; each line is
    # "<which> <HTTP status>" (000 when no answer within 2 s). Stops at /tmp/stop or the bound.
    curl = 'curl -s -o /dev/null --connect-timeout 2 --max-time 2 -w "{} %{{http_code}}\\n" {}; '
    loop = (
        f"i=0; while [ $i -lt {MAX_ITERATIONS} ] && [ ! -f /tmp/stop ]; do "
        + curl.format("c", urls["clusterIP"])
        + curl.format("n", urls["nodePort"])
        + "sleep 0.05; i=$((i+1)); done"
    )
    real.kubectl("exec", "switch-client", "--", "rm", "-f", "/tmp/stop")
    argv = ["nsenter", f"--net=/run/netns/{real.LAN}", str(real.NODE_BIN / "kubectl"),
            f"--kubeconfig={real.STATE / 'admin.kubeconfig'}", "exec", "switch-client", "--",
            "sh", "-c", loop]  # fmt: skip
    client = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    try:
        time.sleep(DWELL)  # kube-proxy alone first
        host.log("switch: pyproxy (iptables) in, kube-proxy out")
        real.use_proxy("pyproxy", "iptables")
        time.sleep(DWELL)
        host.log("switch: pyproxy to nftables mode")
        real.use_proxy("pyproxy", "nftables")
        # Its first sync is done when it is Ready; the other mode's chains go right after.
        for node in ("node-a", "node-b"):
            real.wait(lambda node=node: kernel.serves_in(node, "nftables"), f"{node}: nftables", 60)
        time.sleep(DWELL)
        host.log("switch: pyproxy back to iptables mode")
        real.use_proxy("pyproxy", "iptables")
        for node in ("node-a", "node-b"):
            real.wait(lambda node=node: kernel.serves_in(node, "iptables"), f"{node}: iptables", 60)
        time.sleep(DWELL)
        host.log("switch: kube-proxy (iptables) in, pyproxy out")
        real.use_proxy("kube-proxy", "iptables")
        time.sleep(DWELL)  # kube-proxy alone again
    finally:
        real.kubectl("exec", "switch-client", "--", "touch", "/tmp/stop", check=False)
        out, err = client.communicate(timeout=60)
    seconds = time.monotonic() - t0
    lines = out.split()
    results = list(zip(lines[0::2], lines[1::2], strict=True))
    failed = [r for r in results if r[1] != "200"]
    host.log(
        f"switch: {len(results)} requests in {seconds:.0f}s ({len(results) / seconds:.1f}/s), "
        f"{len(failed)} failed"
    )
    out = real.ROOT / "build" / "switch-result.json"  # the README's figure
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps({"requests": len(results), "failed": len(failed), "seconds": round(seconds)})
    )
    assert len(results) > 10 * seconds, f"the client sent too few requests: {len(results)}; {err}"
    assert not failed, f"{len(failed)} of {len(results)} requests failed: {failed[:10]}"
    for node in ("node-a", "node-b"):
        assert kernel.serves_in(node, "iptables")


@pytest.fixture(autouse=True)
def _cleanup_objects(cluster: dict[str, str]) -> Any:
    yield
    real.kubectl("delete", "pod,service", "-l", "app=switch", "--wait=false", check=False)
    real.kubectl("delete", "pod", "switch-client", "--wait=false", check=False)
