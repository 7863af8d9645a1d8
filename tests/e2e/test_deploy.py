"""deploy/ is valid for a real API server (server-side dry run of every object)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.e2e.kube import Kube

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_every_deploy_object_passes_server_side_dry_run(kube: Kube) -> None:
    resources = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    files = [DEPLOY / r for r in resources]
    assert {f.name for f in files} == {p.name for p in DEPLOY.glob("*.yaml")} - {
        "kustomization.yaml"
    }
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


def test_configmap_config_is_accepted_by_pyproxy(tmp_path: Path) -> None:
    import subprocess

    from tests.netns.world import PYPROXY, ROOT

    cm = yaml.safe_load((DEPLOY / "configmap.yaml").read_text())
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
