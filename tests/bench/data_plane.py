"""Benchmark: the data plane of every mode, beside upstream kube-proxy, in the namespace world.

One API server holds a NodePort Service ``bench/target`` (port 80 -> 8080 on three pods of
the world) among 10, then 10,000 services (the others with 10 endpoints each, as in
side_by_side). For each proxy (pyproxy in iptables, nftables, userspace and ebpf mode;
upstream kube-proxy v1.36.3 in iptables and nftables mode) a fresh node namespace with the
three pods, a client pod and an outside client is built, the proxy started with default
flags (its kubeconfig, node name and cluster CIDR; in ebpf mode a child cgroup and a bpffs
the benchmark made), and once it answers and its syncs have settled:

  pod -> ClusterIP    new TCP connections, one after another, each with one request and its
                      answer, from the client pod (in ebpf mode: in the socket cgroup, as a
                      pod on the node is)
  outside -> NodePort the same from the outside client to the node's address
  floor               the same from the client pod to one server pod's own address: what a
                      connection costs with no service translation on its way

each for 3 runs of 2 s (bounded: at most 200,000 connections a run; the median run by rate
is reported): connections a second, and p50 and p99 of a connection's time (connect to the
server's close). Client and server are ``connload.c``, compiled here, so that what costs is
the path between them. Only addresses inside the world are used.

Usage: python -m tests.bench.data_plane [--quick] [--sizes 10,10000] [--out DIR] [--proxies ...]
Writes data_plane.json and data_plane.md to --out, with progress on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.bench import entry, objects, report
from tests.bench.proxies import metrics_in
from tests.cluster.cluster import (
    KUBE_PROXY_TOKEN,
    PYPROXY_TOKEN,
    Cluster,
    binary,
    kubeconfig,
)
from tests.cluster.nsrelay import Relay
from tests.netns.world import (
    CLUSTER_CIDR,
    NODE_CLIENT_IP,
    PYPROXY,
    Pod,
    SocketCgroup,
    World,
    wait_for,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
M = 10
PODS = 3
PORT = 8080
RUNS, SECONDS, MAX_CONNECTIONS = 3, 2.0, 200_000
PROXIES = ("pyproxy:iptables", "pyproxy:nftables", "pyproxy:userspace", "pyproxy:ebpf",
           "kube-proxy:iptables", "kube-proxy:nftables")  # fmt: skip
LAST = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
FLOOR_POD_IP = Pod("pod-1", 1).ip
"""The first server pod's address (``Run`` adds pod-1 at index 1): what a connection costs
with no service on its way, the bound on what any translation, rules or socket program, can
reach."""
READY_CAP = 5 * 60.0
"""A proxy not answering within 5 minutes is a failed row (upstream's iptables mode did not
finish its first sync at 10,000 services in 15 minutes in side_by_side)."""


def progress(msg: str) -> None:
    print(f"[data plane {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_tool(work: Path) -> Path:
    tool = work / "connload"
    subprocess.run(["clang-14", "-O2", "-Wall", "-o", str(tool), str(HERE / "connload.c")],
                   check=True)  # fmt: skip
    return tool


def target(cluster: Cluster) -> tuple[str, int]:
    """The measured Service and its slice (the world's pod addresses): (ClusterIP, NodePort)."""
    svc = cluster.ok("POST", objects.SERVICES, {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "target", "namespace": objects.NS},
        "spec": {"type": "NodePort",
                 "ports": [{"name": "http", "port": 80, "targetPort": PORT, "protocol": "TCP"}]},
    })  # fmt: skip
    cluster.ok("POST", objects.SLICES, {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "target-1", "namespace": objects.NS,
                     "labels": {"kubernetes.io/service-name": "target",
                                "endpointslice.kubernetes.io/managed-by": "pyproxy-bench"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": PORT, "protocol": "TCP"}],
        "endpoints": [{"addresses": [f"10.244.{i}.2"], "conditions": {"ready": True},
                       "nodeName": "node-a"} for i in range(1, PODS + 1)],
    })  # fmt: skip
    return str(svc["spec"]["clusterIP"]), int(svc["spec"]["ports"][0]["nodePort"])


class Run:
    """One proxy in a fresh world: pods serving, clients ready, the proxy started."""

    def __init__(self, spec: str, cluster: Cluster, work: Path, tool: Path, tag: str) -> None:
        self.name, self.mode = spec.split(":")
        self.tool = tool
        self.dir = work / f"{self.name}-{self.mode}"
        self.dir.mkdir(exist_ok=True)
        self.world = World(tag).build(pod_count=0, client_count=1)
        self.relay: Relay | None = None
        self.proc: subprocess.Popen[str] | None = None
        try:
            for i in range(1, PODS + 1):
                pod = self.world.add_pod(f"pod-{i}", i, echo=False)
                server = self.world.spawn(self.world.ns_of(pod), str(tool), "serve", str(PORT))
                assert server.stdout is not None
                if server.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"connload did not start in {pod.name}")
            self.client_pod = self.world.ns_of(self.world.add_pod("cpod", PODS + 1, echo=False))
            if self.mode == "ebpf":
                self.world.sockets = SocketCgroup(Path(tempfile.mkdtemp(dir=self.dir)))
            self.relay = Relay(self.world.node, 6443, ("127.0.0.1", cluster.api_port))
            self.proc = self.world.spawn(
                self.world.node, *self.command(cluster),
                stdout=(self.dir / "proxy.log").open("a"), stderr=subprocess.STDOUT,
            )  # fmt: skip
        except BaseException:
            self.close()
            raise

    def command(self, cluster: Cluster) -> list[str]:
        server = "https://127.0.0.1:6443"
        if self.name == "pyproxy":
            cfg = self.dir / "kubeconfig"
            cfg.write_text(kubeconfig(server, cluster.ca, PYPROXY_TOKEN))
            sockets = self.world.sockets.flags() if self.world.sockets else []
            return [PYPROXY, f"--mode={self.mode}", f"--kubeconfig={cfg}",
                    "--hostname-override=node-a", f"--cluster-cidr={CLUSTER_CIDR}",
                    # The same conntrack flags as upstream's below.
                    "--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0",
                    "--conntrack-tcp-timeout-close-wait=0", *sockets]  # fmt: skip
        cfg = self.dir / "kp.kubeconfig"
        cfg.write_text(kubeconfig(server, cluster.ca, KUBE_PROXY_TOKEN))
        kube_proxy = binary("kube-proxy")
        assert kube_proxy is not None
        return [str(kube_proxy), f"--proxy-mode={self.mode}", f"--kubeconfig={cfg}",
                "--hostname-override=node-a", f"--cluster-cidr={CLUSTER_CIDR}",
                # Upstream would otherwise write the machine-wide conntrack sysctls.
                "--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0",
                "--conntrack-tcp-timeout-close-wait=0"]  # fmt: skip

    def load(self, ns: str, addr: str, port: int, seconds: float, in_cgroup: bool = False,
             max_connections: int = MAX_CONNECTIONS) -> dict[str, float]:  # fmt: skip
        argv = [str(self.tool), "load", addr, str(port), str(seconds), str(max_connections)]
        res = self.world.exec(ns, *argv, in_cgroup=in_cgroup, timeout=seconds + 120)
        out: dict[str, float] = json.loads(res.stdout)
        return out

    def metric(self, name: str) -> float | None:
        """``name``'s first sample (whatever its labels) on the proxy's /metrics."""
        for line in metrics_in(self.world.node).splitlines():
            if line.startswith(name):
                return float(line.split()[-1])
        return None

    def ready(self, vip: str, node_port: int, timeout: float) -> float:
        """Seconds until both paths answer and the proxy's last sync is 3 s old."""
        t0 = time.monotonic()
        cgroup = self.mode == "ebpf"

        def answers() -> bool | None:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} ({self.mode}) exited: see {self.dir}/proxy.log")
            if self.load(self.client_pod, vip, 80, 1, cgroup, 1)["connections"] != 1:
                return None
            outside = self.load(self.world.client(), NODE_CLIENT_IP, node_port, 1, False, 1)
            return outside["connections"] == 1 or None

        wait_for(answers, timeout=timeout, interval=0.5, what=f"{self.name} to answer")
        ready = time.monotonic() - t0
        self.clear_untranslated(vip)

        def settled() -> bool | None:
            last = self.metric(LAST)
            return (last is not None and time.time() - last > 3) or None

        wait_for(settled, timeout=timeout, interval=1, what=f"{self.name}'s syncs to settle")
        return ready

    def clear_untranslated(self, vip: str) -> None:
        """Forget the connections the probes above sent to the ClusterIP before a rule
        translated it: their conntrack entries (SYN_SENT, the reply expected from the
        ClusterIP itself) stay two minutes, and a measured connection that reuses one's
        source port matches it, is never translated, and waits on SYN retries (a run's
        p99 of seconds and a rate cut by half, seen in every mode alike)."""
        untranslated = ("--orig-dst", vip, "--reply-src", vip)
        self.world.exec(self.world.node, "conntrack", "-D", *untranslated, check=False)

    def close(self) -> None:
        if self.proc is not None:
            self.world.stop(self.proc)
        if self.relay is not None:
            self.relay.close()
        if self.world.sockets is not None:
            self.world.sockets.close()
            self.world.sockets = None
        self.world.close()


def median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """The run with the median rate (its own p50 and p99, not a mix of runs)."""
    ranked = sorted(runs, key=lambda r: r["connections"] / r["seconds"])
    r = ranked[len(ranked) // 2]
    return {"rate": r["connections"] / r["seconds"], "p50_us": r["p50_us"],
            "p99_us": r["p99_us"], "errors": sum(x["errors"] for x in runs)}  # fmt: skip


def measure(run: Run, vip: str, node_port: int, n: int, runs: int = RUNS,
            seconds: float = SECONDS) -> dict[str, Any]:  # fmt: skip
    row: dict[str, Any] = {"proxy": run.name, "mode": run.mode, "services": n}
    row["ready_s"] = run.ready(vip, node_port, timeout=READY_CAP)
    cgroup = run.mode == "ebpf"
    for path, ns, addr, port, in_cgroup in (
        ("clusterip", run.client_pod, vip, 80, cgroup),
        ("nodeport", run.world.client(), NODE_CLIENT_IP, node_port, False),
        # The floor: the same client pod to one server pod's own address, no service between.
        ("floor", run.client_pod, FLOOR_POD_IP, PORT, cgroup),
    ):
        run.load(ns, addr, port, 0.5, in_cgroup)  # warm up
        row[path] = median_run([run.load(ns, addr, port, seconds, in_cgroup)
                                for _ in range(runs)])  # fmt: skip
        r = row[path]
        progress(f"  {path}: {r['rate']:.0f}/s, p50 {r['p50_us']:.0f} us, "
                 f"p99 {r['p99_us']:.0f} us, {r['errors']:.0f} errors")  # fmt: skip
    return row


def markdown(rows: list[dict[str, Any]], quick: bool = False) -> str:
    lines = [f"Data plane on {report.machine()}: new TCP connections one after another, one "
             "request each (" + ("one run of 0.5 s, --quick" if quick else
                                 f"median of {RUNS} runs of {SECONDS:g} s") + ").", "",
             "| services | proxy | mode | pod -> ClusterIP /s | p50 us | p99 us "
             "| outside -> NodePort /s | p50 us | p99 us | floor: pod -> pod /s |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        cells = [f"{r['services']:,}", r["proxy"], r["mode"]]
        for path in ("clusterip", "nodeport"):
            p = r.get(path)
            cells += ([f"{p['rate']:,.0f}", f"{p['p50_us']:.0f}", f"{p['p99_us']:.0f}"]
                      if p else ["failed", "", ""])  # fmt: skip
        floor = r.get("floor")
        cells.append(f"{floor['rate']:,.0f}" if floor else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run(sizes: list[int], proxies: list[str], out: Path, quick: bool = False
        ) -> list[dict[str, Any]]:  # fmt: skip
    rows: list[dict[str, Any]] = []
    with entry.cluster("pyproxy-dataplane-", NODE_CLIENT_IP) as (cluster, work):
        tool = build_tool(work)
        have = 0
        vip, node_port = "", 0
        for n in sizes:
            progress(f"N = {n}: creating services up to {n} ...")
            objects.grow(cluster, have, n - 1, M, progress)  # the target is the n-th
            if not vip:
                vip, node_port = target(cluster)
            have = n - 1
            for k, spec in enumerate(proxies):
                progress(f"N = {n}: {spec}")
                r = Run(spec, cluster, work, tool, f"d{os.getpid() % 1000}{k}")
                try:
                    rows.append(measure(r, vip, node_port, n, *((1, 0.5) if quick else ())))
                except Exception as err:  # one proxy's failure is a row, not the end
                    progress(f"  failed: {err}")
                    rows.append({"proxy": r.name, "mode": r.mode, "services": n,
                                 "failed": str(err)})  # fmt: skip
                finally:
                    r.close()
                (out / "data_plane.json").write_text(json.dumps(rows, indent=1))
                (out / "data_plane.md").write_text(markdown(rows, quick))
    return rows


def main() -> int:
    why = entry.start()
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true",
                    help="10 services, one run of 0.5 s each: for CI")  # fmt: skip
    ap.add_argument("--sizes", default="10,10000")
    ap.add_argument("--proxies", default=",".join(PROXIES))
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args()
    if why:
        print(why, file=sys.stderr)
        return 1
    out = Path(args.out) / ("quick" if args.quick else "")
    out.mkdir(parents=True, exist_ok=True)
    sizes = [10] if args.quick else [int(s) for s in args.sizes.split(",")]
    rows = run(sizes, args.proxies.split(","), out, args.quick)
    print(markdown(rows, args.quick))
    return 0 if all("failed" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
