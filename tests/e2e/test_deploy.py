"""deploy/ is valid for a real API server (server-side dry run of every object). That kubectl's
own kustomize builds each variant is checked in tests/realcluster/test_kustomize.py (kubectl is
built for the real cluster)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.e2e.kube import Kube

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_every_deploy_object_passes_server_side_dry_run(kube: Kube) -> None:
    assert yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"] == ["base"]
    base = DEPLOY / "base"
    resources = yaml.safe_load((base / "kustomization.yaml").read_text())["resources"]
    files = [base / r for r in resources]
    assert {f.name for f in files} == {p.name for p in base.glob("*.yaml")} - {"kustomization.yaml"}
    created = kube.apply_files(*files, dry_run=True)
    kinds = {o["kind"] for o in created}
    assert kinds == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
    }
    ds = next(o for o in created if o["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["serviceAccountName"] == "pyproxy"
    assert pod["containers"][0]["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert pod["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/healthz"
    # Least privilege (measured by tests/image/test_image.py): not privileged, read-only root.
    sc = pod["containers"][0]["securityContext"]
    assert "privileged" not in sc and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN", "NET_RAW"]}


DS = "/apis/apps/v1/namespaces/kube-system/daemonsets/pyproxy"


def variant(kube: Kube, name: str) -> dict[str, Any]:
    """deploy/NAME/ (a kustomization of the base with one DaemonSet patch) applied as
    kustomize's strategic merge does, by the API server with a dry run: the DaemonSet."""
    kustomization = yaml.safe_load((DEPLOY / name / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../base"]  # tests/realcluster builds it with kubectl
    patches = [DEPLOY / name / p["path"] for p in kustomization["patches"]]
    assert [p.name for p in patches] == [f"daemonset-{name}.yaml"]
    kube.apply_files(DEPLOY / "base" / "daemonset.yaml")
    try:
        code, ds = kube.c.request(
            "PATCH", DS + "?dryRun=All", yaml.safe_load(patches[0].read_text()),
            content_type="application/strategic-merge-patch+json",
        )  # fmt: skip
        assert code == 200, ds.get("message", ds)
    finally:
        kube.delete(DS)
    out: dict[str, Any] = ds
    return out


def test_privileged_variant_changes_only_what_it_names(kube: Kube) -> None:
    """deploy/privileged/ patches the DaemonSet (kustomize's strategic merge, done here by the
    API server with a dry run) to privileged with /lib/modules, localhost NodePorts on and
    kube-proxy's conntrack settings; the rest of the base stays."""
    ds = variant(kube, "privileged")
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["securityContext"]["privileged"] is True
    assert c["securityContext"]["capabilities"] == {
        "drop": ["ALL"],
        "add": ["NET_ADMIN", "NET_RAW"],
    }
    assert c["args"] == ["--config=/etc/pyproxy/config.yaml", "--hostname-override=$(NODE_NAME)",
                         "--iptables-localhost-nodeports=true",
                         "--conntrack-max-per-core=32768",
                         "--conntrack-tcp-timeout-established=24h0m0s",
                         "--conntrack-tcp-timeout-close-wait=1h0m0s"]  # fmt: skip
    assert {"name": "lib-modules", "mountPath": "/lib/modules", "readOnly": True} in c[
        "volumeMounts"
    ]
    assert {v["name"] for v in pod["volumes"]} == {"config", "xtables-lock", "lib-modules"}
    assert c["livenessProbe"]["httpGet"]["path"] == "/livez"


def test_configmap_config_is_accepted_by_pyproxy(tmp_path: Path) -> None:
    import subprocess

    from tests.netns.world import PYPROXY, ROOT

    cm = yaml.safe_load((DEPLOY / "base" / "configmap.yaml").read_text())
    cfg = tmp_path / "config.yaml"
    cfg.write_text(cm["data"]["config.yaml"])
    res = subprocess.run(
        [
            PYPROXY,
            "render",
            "--config",
            str(cfg),
            "--manifests",
            str(ROOT / "examples"),
            "--node",
            "node-a",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert "not supported" not in res.stderr
    assert "! -s 10.244.0.0/16 -j KUBE-MARK-MASQ" in res.stdout


def test_ebpf_variant_adds_its_mode_mounts_and_capabilities(kube: Kube) -> None:
    """deploy/ebpf/ patches the DaemonSet to ebpf mode: the node's cgroup2 root and bpffs
    mounted, NET_ADMIN and BPF (measured by tests/image/test_image.py), still not
    privileged and with a read-only root."""
    ds = variant(kube, "ebpf")
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert "privileged" not in sc and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN", "BPF"]}
    assert c["args"][2:] == ["--mode=ebpf", "--bpf-cgroup=/run/pyproxy/cgroup2",
                             "--bpf-pin-dir=/sys/fs/bpf/pyproxy"]  # fmt: skip
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["cgroup2"] == "/run/pyproxy/cgroup2" and mounts["bpffs"] == "/sys/fs/bpf"
    paths = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    assert paths["cgroup2"] == "/sys/fs/cgroup" and paths["bpffs"] == "/sys/fs/bpf"
