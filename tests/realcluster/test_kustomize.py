"""Each of deploy/'s kustomizations builds with kubectl's own kustomize, as an operator's
``kubectl apply -k`` builds it (kustomize refuses, for one, an overlay that names a directory
containing it: deploy/ebpf once did), and yields the objects its README line promises. No
cluster needed: kubectl is the real cluster's."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml

from tests.cluster import real

BASE_ARGS = ["--config=/etc/pyproxy/config.yaml", "--hostname-override=$(NODE_NAME)"]


def build(variant: str) -> dict[str, dict[str, Any]]:
    res = subprocess.run(
        [str(real.NODE_BIN / "kubectl"), "kustomize", str(real.ROOT / "deploy" / variant)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in yaml.safe_load_all(res.stdout)}


@pytest.mark.parametrize(
    ("variant", "args", "caps"),
    [
        ("", BASE_ARGS, ["NET_ADMIN", "NET_RAW"]),
        ("privileged", [*BASE_ARGS, "--iptables-localhost-nodeports=true",
                        "--conntrack-max-per-core=32768",
                        "--conntrack-tcp-timeout-established=24h0m0s",
                        "--conntrack-tcp-timeout-close-wait=1h0m0s"],
         ["NET_ADMIN", "NET_RAW"]),
        ("ebpf", [*BASE_ARGS, "--mode=ebpf", "--bpf-cgroup=/run/pyproxy/cgroup2",
                  "--bpf-pin-dir=/sys/fs/bpf/pyproxy"], ["NET_ADMIN", "BPF"]),
    ],
)  # fmt: skip
def test_every_variant_builds_with_kubectl(variant: str, args: list[str], caps: list[str]) -> None:
    objs = build(variant)
    assert set(objs) == {
        "ServiceAccount/pyproxy",
        "ClusterRole/pyproxy",
        "ClusterRoleBinding/pyproxy",
        "ConfigMap/pyproxy",
        "DaemonSet/pyproxy",
    }
    assert objs["DaemonSet/pyproxy"]["metadata"]["namespace"] == "kube-system"
    (c,) = objs["DaemonSet/pyproxy"]["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "pyproxy:0.1.0"
    assert c["args"] == args
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": caps}
