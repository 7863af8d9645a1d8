"""The ordered full-sync loader, interrupted between its transactions: every chain a service
address can reach is complete (its old or its new content, never missing or half written),
real packets keep reaching pods, and the next sync completes the rule set."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.netns.iptables_compare import kube_rules, load_in_scratch_namespace
from tests.netns.services import HTTP, HTTP_EP, svc
from tests.netns.world import CLUSTER_CIDR, PYPROXY, PYTHON, ROOT, World, manifest_objects, total

pytestmark = pytest.mark.netns
SERVICES = 30


def write_services(world: World, directory: Path, shift: int) -> None:
    """SERVICES services with two endpoints each, on pods chosen by ``shift``."""
    docs: list[dict[str, Any]] = []
    for i in range(SERVICES):
        chosen = [world.pods[(i + shift) % 4], world.pods[(i + shift + 1) % 4]]
        docs += manifest_objects(world, svc(f"s{i}", f"10.96.50.{i + 1}", [HTTP]), chosen, HTTP_EP)
    (directory / "services.yaml").write_text(yaml.safe_dump_all(docs))


def rendered(world: World, directory: Path) -> dict[str, list[str]]:
    text = subprocess.run(
        [PYPROXY, "render", "--manifests", str(directory), "--node", "node-a",
         "--cluster-cidr", CLUSTER_CIDR],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return load_in_scratch_namespace(world, text.split("# IPv6")[0])["nat"]


def interrupted_load(world: World, directory: Path, fail_after: int) -> dict[str, Any]:
    res = world.exec(
        world.node,
        "sh", "-c",
        f"cd {ROOT} && exec {PYTHON} -m tests.netns.interrupted_load {directory} "
        f"--fail-after {fail_after}",
        timeout=120,
    )  # fmt: skip
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def reachable(rules: dict[str, list[str]]) -> set[str]:
    """Chains reachable from the top-level nat chains through jumps."""
    seen: set[str] = set()
    todo = ["KUBE-SERVICES", "KUBE-NODEPORTS"]
    while todo:
        chain = todo.pop()
        if chain in seen or chain not in rules:
            continue
        seen.add(chain)
        todo += [line.split(" -j ")[1].split()[0] for line in rules[chain] if " -j KUBE-" in line]
    return seen


def assert_consistent(dump: dict[str, list[str]], *versions: dict[str, list[str]]) -> None:
    for chain in reachable(dump) - {"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-MARK-MASQ"}:
        assert any(dump[chain] == v.get(chain) for v in versions), (chain, dump[chain])


def probe_all(world: World) -> int:
    return sum(total(world.probe("tcp", f"10.96.50.{i + 1}", 80, count=2)) for i in range(SERVICES))


def test_interrupted_cold_start_and_resync(world: World, tmp_path: Path) -> None:
    write_services(world, tmp_path, shift=0)
    first = rendered(world, tmp_path)
    out = interrupted_load(world, tmp_path, fail_after=3)
    assert "killed (injected by the test)" in out["first"]
    assert out["transactions"] > 5  # the interruption fell between transactions
    cold = kube_rules(out["nat"])
    assert cold.get("KUBE-SERVICES", []) == []  # nothing is reachable yet, nothing dangles
    assert cold.keys() - {"KUBE-MARK-MASQ"}, "the first transactions wrote service chains"
    for chain in cold.keys() - {"KUBE-MARK-MASQ"}:
        assert cold[chain] == first[chain], chain  # written whole or not at all
    out = interrupted_load(world, tmp_path, fail_after=10_000)  # the next sync
    assert out["first"] == "ok" and kube_rules(out["nat"]) == first
    assert probe_all(world) == SERVICES * 2

    write_services(world, tmp_path, shift=2)  # every service moves to other pods
    second = rendered(world, tmp_path)
    out = interrupted_load(world, tmp_path, fail_after=4)  # endpoint chains and some services
    assert "killed (injected by the test)" in out["first"]
    mid = kube_rules(out["nat"])
    assert_consistent(mid, first, second)
    assert any(mid[c] == second.get(c) != first.get(c) for c in reachable(mid))  # half done
    assert probe_all(world) == SERVICES * 2  # and every service answers meanwhile
    out = interrupted_load(world, tmp_path, fail_after=10_000)
    assert out["first"] == "ok" and kube_rules(out["nat"]) == second
    assert probe_all(world) == SERVICES * 2
