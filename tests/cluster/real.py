"""A real cluster on this machine: a control plane in its own network namespace on the nodes'
network, two nodes each with a kubelet, containerd and CNI, and a Service proxy deployed as a
DaemonSet the way an operator deploys one (pyproxy from ``deploy/``, or upstream kube-proxy
as kubeadm deploys it). The machine's own network namespace is never touched; see host.py
for what the cluster lives in and how it is removed.

    python -m tests.cluster.real up [--proxy pyproxy|kube-proxy] [--mode iptables|nftables|ebpf]
                                    [--family ipv4|ipv6|dual]
    python -m tests.cluster.real proxy pyproxy|kube-proxy [--mode ...]   (switch a live cluster)
    python -m tests.cluster.real down

Binaries come from ``tests/cluster/build.sh node`` and images from ``tests/cluster/images.sh``.
The admin kubeconfig is ``$STATE/admin.kubeconfig``, for a kubectl run in the ``pyk-lan``
network namespace (``kubectl()`` below).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from pyproxy.kernel import bpf_mounts
from tests.cluster import family as families
from tests.cluster import host
from tests.cluster.cluster import BIN as CP_BIN
from tests.cluster.cluster import CACHE, K8S_VERSION, apiserver_security, kubeconfig, make_pki
from tests.cluster.node import Node

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
STATE = Path(os.environ.get("PYPROXY_REAL_CLUSTER_DIR", "/tmp/pyproxy-real-cluster"))
CONTAINERD_VERSION = os.environ.get("CONTAINERD_VERSION", "v2.3.7")
COREDNS_VERSION = os.environ.get("COREDNS_VERSION", "v1.14.2")
NODE_BIN = CACHE / f"node-{K8S_VERSION}-containerd-{CONTAINERD_VERSION}-coredns-{COREDNS_VERSION}"
IMAGES = CACHE / "images"
LAN = host.PREFIX + "lan"
NODE_NAMES = ("node-a", "node-b")
ADMIN_TOKEN = "pyk-admin-token"
PROXIES = ("pyproxy", "kube-proxy")
MODES = ("iptables", "nftables", "ebpf")  # ebpf: pyproxy only
# What the proxy DaemonSets are called and how their pods are labelled.
DAEMONSETS = {
    "pyproxy": ("pyproxy", "app.kubernetes.io/name=pyproxy"),
    # pyproxy's pods carry kube-proxy's label too (deploy/base/daemonset.yaml).
    "kube-proxy": ("kube-proxy", "k8s-app=kube-proxy,!app.kubernetes.io/name"),
}


def family() -> str:
    """The IP family of the cluster that is up (or was last brought up): ipv4, ipv6 or dual."""
    return str(_state().get("family", "ipv4"))


def nodes(fam: str | None = None) -> list[Node]:
    st = families.stacks(fam or family())
    return [
        Node(
            name,
            tuple(s.node_ip(i) for s in st),
            tuple(s.pod_cidrs[i] for s in st),
            st[0].dns_ip,
            STATE / name,
        )
        for i, name in enumerate(NODE_NAMES)
    ]


def lan_ip() -> str:
    """The API server's address on the lan, in the cluster's primary family."""
    return families.stacks(family())[0].lan_ip


def node_token(name: str) -> str:
    return f"pyk-{name}-token"


def missing() -> list[str]:
    want = [CP_BIN / b for b in ("etcd", "kube-apiserver", "kube-controller-manager")]
    want += [
        NODE_BIN / b
        for b in (
            "kubelet",
            "kube-scheduler",
            "kubectl",
            "containerd",
            "containerd-shim-runc-v2",
            "ctr",
        )
    ]
    archives = ("pause", "agnhost", "pyproxy", "kube-proxy", "coredns")
    want += [IMAGES / f"{a}.tar" for a in archives]
    want += [Path("/usr/sbin/runc"), Path("/usr/lib/cni/ptp")]
    return [str(p) for p in want if not p.exists()]


# ---- kubectl in the lan namespace ---------------------------------------------------------


def bpf_cgroup(node: str) -> Path:
    """The cgroup v2 directory that holds ``node``'s pods and nothing else: its kubelet's
    cgroupRoot, as runc writes it in the hybrid layout (``/sys/fs/cgroup/unified/pyk-<node>``,
    a child of the machine's root cgroup). ebpf mode's socket programs attach here, so they
    balance that node's pods only; the node's own processes (its kubelet, a shell in its
    namespace) are outside it and reach Services through the nftables rules."""
    return _cgroup2() / (host.PREFIX + node)


def _cgroup2() -> Path:
    """The machine's cgroup v2 mount (``/sys/fs/cgroup/unified`` in the hybrid layout), as
    ebpf mode finds it by default."""
    root = bpf_mounts.cgroup2_root()
    if root is None:
        raise RuntimeError("no cgroup v2 mount on this machine (ebpf mode needs one)")
    return Path(root)


def supports(proxy: str, mode: str) -> bool:
    """Whether ``proxy`` has ``mode`` (ebpf is pyproxy's only)."""
    return proxy in PROXIES and mode in MODES and (proxy == "pyproxy" or mode != "ebpf")


def bpf_pin_dir(node: str) -> str:
    """Where ``node``'s pyproxy pins its programs, in the cluster's own bpffs: the two nodes
    share one mount namespace, so each has a directory of its own."""
    return f"/sys/fs/bpf/pyproxy-{node}"


def kubectl(*args: str, check: bool = True, stdin: str | None = None, timeout: float = 120) -> str:
    argv = [
        "nsenter",
        f"--net=/run/netns/{LAN}",
        str(NODE_BIN / "kubectl"),
        f"--kubeconfig={STATE / 'admin.kubeconfig'}",
        *args,
    ]
    res = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {res.stderr.strip()[-2000:]}")
    return res.stdout


def get(*args: str) -> Any:
    return json.loads(kubectl("get", "-o", "json", *args))


def wait(pred: Any, what: str, timeout: float, every: float = 1.0) -> Any:
    """Poll ``pred`` (a fact read from the API or the kernel) until it is truthy."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = pred()
        except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
            last = e
        else:
            if last:
                return last
        time.sleep(every)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


# ---- bring-up -----------------------------------------------------------------------------


def _state() -> dict[str, Any]:
    f = STATE / "state.json"
    return json.loads(f.read_text()) if f.exists() else {}


def _save(st: dict[str, Any]) -> None:
    (STATE / "state.json").write_text(json.dumps(st, indent=1))


def running() -> bool:
    st = _state()
    return bool(st.get("holder")) and Path(f"/proc/{st['holder']}").exists()


def holder() -> int:
    """The process whose namespaces the running cluster's processes are started in."""
    return int(_state()["holder"])


def up(proxy: str = "pyproxy", mode: str = "iptables", fam: str = "ipv4") -> None:
    families.stacks(fam)  # an unknown family fails here, before anything is made
    if running():
        if family() != fam:
            raise SystemExit(
                f"a {family()} cluster is up ({STATE}); make cluster-down, then bring up {fam}"
            )
        host.log(f"cluster already up ({STATE}); switching its proxy to {proxy} {mode}")
        use_proxy(proxy, mode)
        return
    gone = missing()
    if gone:
        raise SystemExit(
            "missing: "
            + ", ".join(gone)
            + "\nrun: tests/cluster/build.sh node && make image && tests/cluster/images.sh"
        )
    left = host.teardown(STATE, [])  # what an interrupted run left
    if left:
        raise SystemExit(f"cannot remove what an earlier cluster left: {left}")
    t0 = time.monotonic()
    STATE.mkdir(parents=True)
    ns = nodes(fam)
    host.log(
        f"{fam} cluster; network namespaces: pyk-lan (control plane) and "
        + ", ".join(n.netns for n in ns)
    )
    try:
        host.make_network(families.stacks(fam), list(NODE_NAMES))
        holder = host.start_holder(STATE)
        st: dict[str, Any] = {"holder": holder, "pids": {}, "kubelets": [], "family": fam}
        _save(st)
        _control_plane(holder, st, fam)
        host.log(f"control plane up at {families.server(fam)} ({time.monotonic() - t0:.0f}s)")
        archives = sorted(IMAGES.glob("*.tar"))
        for n in ns:
            pids = n.start(holder, NODE_BIN, STATE / f"{n.name}.kubeconfig", archives)
            st["pids"][f"containerd-{n.name}"], st["pids"][f"kubelet-{n.name}"] = pids
            st["kubelets"].append(pids[1])
            _save(st)
            host.log(f"{n.name}: containerd and kubelet started, {len(archives)} images imported")
        wait(nodes_ready, "both nodes Ready", 180)
        host.log(f"nodes Ready ({time.monotonic() - t0:.0f}s)")
        use_proxy(proxy, mode)
        ensure_dns()
        took = time.monotonic() - t0
        host.log(f"cluster up in {took:.0f}s; admin kubeconfig {STATE / 'admin.kubeconfig'}")
    except BaseException:
        host.log("bring-up failed; logs in " + str(STATE))
        for f in sorted([*STATE.glob("*.log"), *STATE.glob("node-*/*.log")]):
            tail = f.read_text(errors="replace").splitlines()[-15:]
            print(f"--- {f} (last lines)\n" + "\n".join(tail), file=sys.stderr)
        down()
        raise


def _control_plane(holder: int, st: dict[str, Any], fam: str) -> None:
    pki = STATE / "pki"
    stacks = families.stacks(fam)
    ips = [ip for s in stacks for ip in (s.lan_ip, s.kubernetes_ip)]
    make_pki(pki, ips=(*ips, "127.0.0.1", "::1"))
    server = families.server(fam)
    rows = [f'{ADMIN_TOKEN},admin,admin-uid,"system:masters"']
    for name in NODE_NAMES:
        rows.append(f'{node_token(name)},system:node:{name},{name}-uid,"system:nodes"')
        (STATE / f"{name}.kubeconfig").write_text(
            kubeconfig(server, pki / "ca.crt", node_token(name))
        )
    (STATE / "tokens.csv").write_text("\n".join(rows) + "\n")
    (STATE / "admin.kubeconfig").write_text(kubeconfig(server, pki / "ca.crt", ADMIN_TOKEN))
    admin = str(STATE / "admin.kubeconfig")

    def start(name: str, *cmd: str) -> None:
        st["pids"][name] = host.spawn(holder, LAN, STATE / f"{name}.log", *cmd)
        _save(st)

    start(
        "etcd",
        str(CP_BIN / "etcd"),
        f"--data-dir={STATE / 'etcd'}",
        "--listen-client-urls=http://127.0.0.1:2379",
        "--advertise-client-urls=http://127.0.0.1:2379",
        "--listen-peer-urls=http://127.0.0.1:2380",
        "--initial-advertise-peer-urls=http://127.0.0.1:2380",
        "--initial-cluster=default=http://127.0.0.1:2380",
        "--unsafe-no-fsync",
        "--log-level=warn",
    )
    start(
        "kube-apiserver",
        str(CP_BIN / "kube-apiserver"),
        "--etcd-servers=http://127.0.0.1:2379",
        # An IPv6 wildcard takes both families (bindv6only is 0 in the lan namespace).
        "--bind-address=" + ("::" if any(s.ipv6 for s in stacks) else "0.0.0.0"),
        f"--advertise-address={stacks[0].lan_ip}",
        "--secure-port=6443",
        *apiserver_security(pki, STATE / "tokens.csv", families.joined(fam, "service_cidr")),
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--kubelet-preferred-address-types=InternalIP",
        "--v=1",
    )
    wait(
        lambda: kubectl("get", "--raw", "/readyz", check=False).strip() == "ok",
        "kube-apiserver",
        120,
        0.5,
    )
    start(
        "kube-controller-manager",
        str(CP_BIN / "kube-controller-manager"),
        f"--kubeconfig={admin}",
        "--leader-elect=false",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-cidr={families.joined(fam, 'cluster_cidr')}",
        f"--service-cluster-ip-range={families.joined(fam, 'service_cidr')}",
        "--bind-address=127.0.0.1",
        "--v=1",
    )
    start(
        "kube-scheduler",
        str(NODE_BIN / "kube-scheduler"),
        f"--kubeconfig={admin}",
        f"--authentication-kubeconfig={admin}",
        f"--authorization-kubeconfig={admin}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        "--v=1",
    )


def ensure_dns() -> None:
    """CoreDNS (manifests/coredns.yaml) as the kube-dns Service at the cluster DNS's address
    of each family (dual-stack: both, the primary's first, which the kubelets give pods)."""
    docs = list(yaml.safe_load_all((HERE / "manifests" / "coredns.yaml").read_text()))
    stacks = families.stacks(family())
    for d in docs:
        if d["kind"] == "Service":
            d["spec"]["clusterIP"] = stacks[0].dns_ip
            d["spec"]["clusterIPs"] = [s.dns_ip for s in stacks]
            d["spec"]["ipFamilyPolicy"] = "RequireDualStack" if len(stacks) > 1 else "SingleStack"
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))
    kubectl(
        "rollout",
        "status",
        "deployment/coredns",
        "-n",
        "kube-system",
        "--timeout=180s",
        timeout=200,
    )


def is_ready(obj: dict[str, Any]) -> bool:
    """A Node's or Pod's Ready condition is True."""
    conditions = obj["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def nodes_ready() -> bool:
    ready = {n["metadata"]["name"] for n in get("nodes")["items"] if is_ready(n)}
    return ready == set(NODE_NAMES)


# ---- the proxy ----------------------------------------------------------------------------


def _pyproxy_kustomization(mode: str, privileged: bool = False) -> Path:
    """deploy/ (deploy/ebpf in ebpf mode) as an operator applies it, with two patches: the API
    server's own address (the proxy cannot reach it through the Service it has not programmed
    yet, so kube-proxy's kubeconfig names it too) and the mode; in ebpf mode a third, this
    machine's layout (``_ebpf_patch``). ``privileged``: as kube-proxy runs here (its manifest),
    a privileged container that sets the node's conntrack timeouts (not the table's size: the
    node is a namespace of its own) and serves NodePorts on localhost, what deploy/privileged
    adds, in any mode."""
    d = STATE / "deploy-pyproxy"
    d.mkdir(exist_ok=True)
    variant = ROOT / "deploy" / ("ebpf" if mode == "ebpf" else "")
    cm = yaml.safe_load((ROOT / "deploy" / "base" / "configmap.yaml").read_text())
    config = yaml.safe_load(cm["data"]["config.yaml"])
    config["mode"] = mode
    config["clusterCIDR"] = families.joined(family(), "cluster_cidr")
    if privileged:
        config["conntrack"] = {"maxPerCore": 0}  # kube-proxy.yaml's: upstream's timeouts
        config.setdefault("iptables", {})["localhostNodePorts"] = True
    env = [
        {
            "op": "add",
            "path": "/spec/template/spec/containers/0/env/-",
            "value": {"name": k, "value": v},
        }
        for k, v in (("KUBERNETES_SERVICE_HOST", lan_ip()), ("KUBERNETES_SERVICE_PORT", "6443"))
    ]
    kust = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(variant, d)],
        "patches": [
            {"target": {"kind": "DaemonSet", "name": "pyproxy"}, "patch": json.dumps(env)},
            *([_ebpf_patch()] if mode == "ebpf" else []),
            *([_privileged_patch()] if privileged else []),
            {
                "target": {"kind": "ConfigMap", "name": "pyproxy"},
                "patch": json.dumps(
                    [
                        {
                            "op": "replace",
                            "path": "/data/config.yaml",
                            "value": yaml.safe_dump(config, sort_keys=False),
                        }
                    ]
                ),
            },
        ],
    }
    (d / "kustomization.yaml").write_text(yaml.safe_dump(kust, sort_keys=False))
    return d


def _privileged_patch() -> dict[str, Any]:
    sc = {"privileged": True, "allowPrivilegeEscalation": True}
    ops = [
        {"op": "replace", "path": "/spec/template/spec/containers/0/securityContext", "value": sc}
    ]
    return {"target": {"kind": "DaemonSet", "name": "pyproxy"}, "patch": json.dumps(ops)}


def _ebpf_patch() -> dict[str, Any]:
    """deploy/ebpf on this machine, as its kustomization's comment tells an operator with the
    hybrid layout: the cgroup2 volume is the hybrid layout's mount, and, as both nodes share
    the machine's cgroups and the cluster's bpffs, each node's pyproxy attaches to its own
    node's pods' cgroup (``bpf_cgroup``) and pins in a directory of its own (``bpf_pin_dir``)."""
    ebpf = yaml.safe_load((ROOT / "deploy" / "ebpf" / "daemonset-ebpf.yaml").read_text())
    (container,) = ebpf["spec"]["template"]["spec"]["containers"]
    per_node = {
        "--bpf-cgroup": f"/run/pyproxy/cgroup2/{host.PREFIX}$(NODE_NAME)",
        "--bpf-pin-dir": bpf_pin_dir("$(NODE_NAME)"),
    }

    def for_node(arg: str) -> str:
        flag = arg.split("=", 1)[0]
        return f"{flag}={per_node[flag]}" if flag in per_node else arg

    args = [for_node(a) for a in container["args"]]  # deploy/ebpf's, two of them per node
    assert {a.split("=", 1)[0] for a in container["args"]} >= set(per_node), container["args"]
    patch = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "pyproxy", "namespace": "kube-system"},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "pyproxy",
                            "args": args,
                        }
                    ],
                    "volumes": [
                        {
                            "name": "cgroup2",
                            "hostPath": {"path": str(_cgroup2()), "type": "Directory"},
                        }
                    ],
                }
            }
        },
    }
    return {"target": {"kind": "DaemonSet", "name": "pyproxy"}, "patch": yaml.safe_dump(patch)}


def cleanup_ebpf(node: str) -> None:
    """What leaving ebpf mode takes on ``node``, as an operator does it (README "ebpf mode"):
    ``pyproxy cleanup --mode=ebpf`` in the node's namespace, with the node's flags. The base
    DaemonSet mounts no bpffs, so a pyproxy in another mode cannot unpin the programs."""
    host.inside(
        holder(),
        host.PREFIX + node,
        str(ROOT / ".venv" / "bin" / "pyproxy"),
        "cleanup",
        "--mode=ebpf",
        f"--bpf-cgroup={bpf_cgroup(node)}",
        f"--bpf-pin-dir={bpf_pin_dir(node)}",
    )


def _kube_proxy_manifest(mode: str) -> str:
    text = (HERE / "manifests" / "kube-proxy.yaml").read_text()
    fam = family()
    return (
        text.replace("${MODE}", mode)
        .replace("${SERVER}", families.server(fam))
        .replace("${CLUSTER_CIDR}", families.joined(fam, "cluster_cidr"))
    )


def proxy_pods(proxy: str) -> dict[str, dict[str, Any]]:
    """The proxy's pods that are Running and Ready, by node."""
    _, selector = DAEMONSETS[proxy]
    out = {}
    for p in get("pods", "-n", "kube-system", "-l", selector)["items"]:
        running = p["status"].get("phase") == "Running"
        if running and is_ready(p) and "deletionTimestamp" not in p["metadata"]:
            out[p["spec"]["nodeName"]] = p
    return out


def deploy(proxy: str, mode: str, privileged: bool = False) -> None:
    name, _ = DAEMONSETS[proxy]
    existed = bool(
        kubectl(
            "get", "daemonset", name, "-n", "kube-system", "--ignore-not-found", "-o", "name"
        ).strip()
    )
    if proxy == "pyproxy":
        kubectl("apply", "-k", str(_pyproxy_kustomization(mode, privileged)))
    else:
        kubectl("apply", "-f", "-", stdin=_kube_proxy_manifest(mode))
    if existed:  # a changed ConfigMap alone restarts nothing: restart as an operator would
        kubectl("rollout", "restart", f"daemonset/{name}", "-n", "kube-system")
    kubectl(
        "rollout", "status", f"daemonset/{name}", "-n", "kube-system", "--timeout=180s", timeout=200
    )
    wait(lambda: set(proxy_pods(proxy)) == set(NODE_NAMES), f"{proxy} Ready on every node", 120)


def remove(proxy: str) -> None:
    name, selector = DAEMONSETS[proxy]
    kubectl(
        "delete",
        "daemonset",
        name,
        "-n",
        "kube-system",
        "--ignore-not-found",
        "--wait=true",
        timeout=180,
    )
    wait(
        lambda: not get("pods", "-n", "kube-system", "-l", selector)["items"],
        f"{proxy} pods gone",
        120,
    )


def use_proxy(proxy: str, mode: str, privileged: bool = False) -> None:
    """The cluster served by ``proxy`` in ``mode``: deploy it, then remove the other.
    ``privileged``: pyproxy as a privileged pod, as kube-proxy runs (_pyproxy_kustomization)."""
    if not supports(proxy, mode):
        raise ValueError(f"{proxy} has no {mode} mode")
    other = [p for p in PROXIES if p != proxy]
    st = _state()
    if st.get("proxy") == "pyproxy" and st.get("mode") == "ebpf" and mode != "ebpf":
        # Its programs outlive its pods (pinned): remove the DaemonSet, then them.
        remove("pyproxy")
        for node in NODE_NAMES:
            cleanup_ebpf(node)
    deploy(proxy, mode, privileged)
    for p in other:
        remove(p)
    st = _state()
    st["proxy"], st["mode"] = proxy, mode
    _save(st)
    host.log(f"{proxy} ({mode}) running on {', '.join(NODE_NAMES)}")


def down() -> None:
    st = _state()
    left = host.teardown(STATE, list(st.get("kubelets", [])))
    if left:
        raise SystemExit("could not remove: " + ", ".join(left))
    host.log("real cluster removed")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.cluster.real")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("up", "proxy"):
        p = sub.add_parser(name)
        if name == "proxy":
            p.add_argument("proxy", choices=PROXIES)
        else:
            p.add_argument("--proxy", choices=PROXIES, default="pyproxy")
        p.add_argument("--mode", choices=MODES, default="iptables")
        if name == "up":
            p.add_argument("--family", choices=list(families.FAMILIES), default="ipv4")
    sub.add_parser("down")
    a = ap.parse_args(argv)
    if a.cmd == "up":
        up(a.proxy, a.mode, a.family)
    elif a.cmd == "proxy":
        if not running():
            raise SystemExit("no real cluster is up (python -m tests.cluster.real up)")
        use_proxy(a.proxy, a.mode)
    else:
        down()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
