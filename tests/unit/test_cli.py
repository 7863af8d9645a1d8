"""The real console script, run as a subprocess."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROXY = str(Path(sys.executable).with_name("pyproxy"))


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYPROXY, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args", [["--help"], ["render", "--help"], ["cleanup", "--help"]])
def test_help(args: list[str]) -> None:
    res = run(*args)
    assert res.returncode == 0 and "Usage: pyproxy" in res.stdout


def test_version() -> None:
    assert run("version").stdout.strip() == "pyproxy 0.1.0"


def test_render_examples_program_the_demo_service() -> None:
    res = run(
        "render",
        "--mode=iptables",
        "--manifests",
        str(ROOT / "examples"),
        "--node",
        "node-a",
        "--cluster-cidr",
        "10.244.0.0/16",
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert out.startswith("# IPv4: input for iptables-restore")
    assert (
        '-A KUBE-SERVICES -m comment --comment "demo/web:http cluster IP" -m tcp -p tcp '
        "-d 10.96.0.10 --dport 80 -j KUBE-SVC-"
    ) in out
    assert "-m tcp -p tcp --dport 30080 -j KUBE-EXT-" in out
    assert out.count("-j DNAT --to-destination 10.244.") == 6  # 3 pods x (http, dns)
    assert "--probability 0.3333333333" in out


@pytest.mark.parametrize(
    "args,flag",
    [
        (["--mode=bogus"], "--mode"),
        (["--cluster-cidr=10.0.0.0/33", "--manifests=/"], "--cluster-cidr"),
        (["--min-sync-period=fast", "--manifests=/"], "--min-sync-period"),
        (["--sync-period=1s", "--min-sync-period=5s", "--manifests=/"], "--min-sync-period"),
        (["--manifests=/nonexistent-dir"], "--manifests"),
        (["--kubeconfig=/nonexistent/kubeconfig"], "--kubeconfig"),
        (["--nodeport-addresses=wat"], "--nodeport-addresses"),
        (["--metrics-bind-address=nope", "--manifests=/"], "--metrics-bind-address"),
        (["--no-such-flag"], "--no-such-flag"),
        (["render", "--manifests=/nonexistent"], "--manifests"),
        (["--service-metrics-max-series=0", "--manifests=/"], "--service-metrics-max-series"),
        (["trace", "--from=10.0.0.1", "--to=10.96.0.1", "--manifests=/"], "--to"),
        (["trace", "--from=nope", "--to=10.96.0.1:80", "--manifests=/"], "--from"),
        (["trace", "--from=fd00::1", "--to=10.96.0.1:80", "--manifests=/"], "--to"),
        (
            ["trace", "--from=10.0.0.1", "--to=10.96.0.1:80", "--manifests=/nonexistent"],
            "--manifests",
        ),
        (["explain", "ns/svc", "--manifests=/nonexistent"], "--manifests"),
    ],
)
def test_bad_flags_give_one_line_and_status_2(args: list[str], flag: str) -> None:
    res = run(*args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pyproxy: error:") and flag in lines[0]


def test_render_nftables_prints_one_loadable_transaction() -> None:
    res = run(
        "render", "--mode=nftables", "--manifests", str(ROOT / "examples"), "--node", "node-a",
        "--cluster-cidr", "10.244.0.0/16",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "# IPv4: input for nft -f"
    assert 'add table ip kube-proxy { comment "rules for kube-proxy" ; }' in lines
    # upstream's chain name: base32(sha256("ns/name/proto/port"))[:8] + "-" + that name
    h = base64.b32encode(hashlib.sha256(b"demo/web/tcp/http").digest()).decode()[:8]
    element = f"{{ 10.96.0.10 . tcp . 80 : goto service-{h}-demo/web/tcp/http }}"
    assert f"add element ip kube-proxy service-ips {element}" in lines


def test_config_file_and_flags_override(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
        "clusterCIDR: 10.244.0.0/16\niptables: {masqueradeAll: true, masqueradeBit: 10}\n"
        "winkernel: {networkName: l2}\n"
    )
    res = run(
        "render", "--config", str(cfg), "--manifests", str(ROOT / "examples"), "--node", "node-a"
    )
    assert res.returncode == 0, res.stderr
    assert "winkernel.networkName is not supported" in res.stderr
    assert "-d 10.96.0.10 --dport 80 -j KUBE-MARK-MASQ" in res.stdout  # masqueradeAll from file
    assert "--or-mark 0x400" in res.stdout  # masqueradeBit 10 from the file
    res2 = run(
        "render",
        "--config",
        str(cfg),
        "--iptables-masquerade-bit",
        "12",
        "--manifests",
        str(ROOT / "examples"),
        "--node",
        "node-a",
    )
    assert "--or-mark 0x1000" in res2.stdout  # the flag wins over the file


def test_write_config_to(tmp_path: Path) -> None:
    out = tmp_path / "defaults.yaml"
    assert run("--write-config-to", str(out)).returncode == 0
    text = out.read_text()
    assert "kind: KubeProxyConfiguration" in text and "minSyncPeriod: 1s" in text


NODEPORTS_NOT_LOCALHOST = (
    '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be '
    'the last rule in this chain" -m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j KUBE-NODEPORTS'
)


@pytest.mark.parametrize(
    ("flags", "localhost"),
    [
        ([], True),
        (["--iptables-localhost-nodeports"], True),
        (["--iptables-localhost-nodeports=true"], True),
        (["--iptables-localhost-nodeports=false"], False),
    ],
)
def test_boolean_flags_take_upstreams_forms(flags: list[str], localhost: bool) -> None:
    """Boolean flags as Go's flag package takes them (``--flag=false`` is how DaemonSets turn
    upstream's localhost NodePorts off)."""
    res = run("render", "--manifests", str(ROOT / "examples"), "--hostname-override", "node-a",
              *flags)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert (NODEPORTS_NOT_LOCALHOST in res.stdout.splitlines()) is not localhost
