"""``pyproxy diff`` in each mode that supports it: status 0 right after pyproxy synced, status
1 after one of its objects was deleted by hand, naming that object under its service."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from tests.netns.services import HTTP, HTTP_EP, pods, reachable, svc
from tests.netns.world import (
    CLUSTER_CIDR,
    CLUSTER_CIDR6,
    PYPROXY,
    Pyproxy,
    World,
    manifest_objects,
)

pytestmark = pytest.mark.netns
PYPROXY_MODES = ("iptables", "nftables", "userspace")
# No drift check (it runs every sync period) may put the deleted object back before diff looks.
PYPROXY_FLAGS = ("--sync-period", "1h", "--metrics-bind-address", "127.0.0.1:10249")
DAEMON = "http://127.0.0.1:10249"
IP = "10.96.44.1"


def diff(world: World, proxy: Pyproxy, *extra: str) -> tuple[int, str]:
    res = world.exec(
        world.node, PYPROXY, "diff", "--mode", proxy.mode, "--manifests", str(proxy.manifests),
        "--hostname-override", "node-a", "--cluster-cidr", f"{CLUSTER_CIDR},{CLUSTER_CIDR6}",
        *extra, check=False,
    )  # fmt: skip
    assert res.returncode in (0, 1), res.stderr
    return res.returncode, res.stdout


def from_daemon(world: World) -> tuple[int, str]:
    """``pyproxy diff --from-daemon``: the daemon compares the kernel with its own state."""
    res = world.exec(world.node, PYPROXY, "diff", "--from-daemon", DAEMON, check=False)
    assert res.returncode in (0, 1), res.stderr
    return res.returncode, res.stdout


def delete_one(world: World, proxy: Pyproxy) -> tuple[str, str]:
    """Delete one of the service's objects by hand; (the object's heading, the line gone)."""
    pod = world.pods[0]
    if proxy.mode == "nftables":
        element = f"{IP} . tcp . 80"
        world.exec(world.node, "nft", "delete", "element", "ip", "kube-proxy", "service-ips",
                   f"{{ {element} }}")  # fmt: skip
        return "table ip kube-proxy map service-ips", f"element {element} : goto "
    save = world.iptables_save("nat").splitlines()
    if proxy.mode == "userspace":  # the relay's port is the daemon's: diff names <relay port>
        redirect = next(ln for ln in save if ln.startswith("-A KUBE-PORTALS-CONTAINER ")
                        and f" -d {IP}/32 " in ln and " -j REDIRECT " in ln)  # fmt: skip
        world.exec(world.node, "iptables-nft", "-t", "nat",
                   *shlex.split(redirect.replace("-A", "-D", 1)))  # fmt: skip
        assert redirect not in world.iptables_save("nat").splitlines()
        shown = re.sub(r"--to-ports \d+", "--to-ports <relay port>", redirect)
        return "IPv4 nat chain KUBE-PORTALS-CONTAINER", shown
    dnat = next(ln for ln in save if ln.startswith("-A KUBE-SEP-") and '"t/dif:http"' in ln
                and ln.endswith(f"--to-destination {pod.ip}:8080"))  # fmt: skip
    chain = dnat.split()[1]
    world.exec(world.node, "iptables-nft", "-t", "nat", "-D", chain, "2")  # the DNAT, after MASQ
    assert dnat not in world.iptables_save("nat").splitlines()
    return f"IPv4 nat chain {chain}", dnat


def test_diff_is_clean_after_a_sync_and_names_a_deleted_object(
    world: World, proxy: Pyproxy
) -> None:
    proxy.write("dif", *manifest_objects(world, svc("dif", IP, [HTTP]), pods(world, 1, 2),
                                         HTTP_EP))  # fmt: skip
    reachable(world, IP)
    code, out = diff(world, proxy)
    assert (code, out) == (0, "no differences: the kernel holds what pyproxy would program\n")
    assert from_daemon(world) == (code, out)  # the daemon's own state and flags: the same

    heading, gone = delete_one(world, proxy)
    code, out = diff(world, proxy)
    assert code == 1, out
    lines = out.splitlines()
    block = lines[lines.index("service t/dif:") :]
    assert f"  {heading}" in block
    missing = [ln[6:] for ln in block if ln.startswith("    - ")]
    assert any(m == gone or (gone.endswith(" ") and m.startswith(gone)) for m in missing), out

    assert from_daemon(world) == (code, out)
    code, text = diff(world, proxy, "--output", "json")
    doc = json.loads(text)
    assert code == 1 and doc["equal"] is False
    assert [d["service"] for d in doc["differences"]] == ["t/dif"]
    proxy.remove("dif")
