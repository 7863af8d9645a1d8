"""Compare rule sets the way the kernel sees them: load rendered text into a scratch
namespace and read it back with iptables-save, so formatting differences vanish."""

from __future__ import annotations

import re

from tests.netns.world import World, sh

CHAIN = re.compile(r"^:(KUBE-[A-Z0-9-]+) ")


def kube_rules(save_text: str) -> dict[str, list[str]]:
    """KUBE-* chains and their rules (in order), as iptables-save prints them."""
    out: dict[str, list[str]] = {}
    for line in save_text.splitlines():
        m = CHAIN.match(line)
        if m and m.group(1) != "KUBE-PROXY-CANARY":
            out.setdefault(m.group(1), [])
        elif line.startswith("-A KUBE-"):
            out.setdefault(line.split()[1], []).append(line)
    return out


def load_in_scratch_namespace(
    world: World, restore_text: str, backend: str = "nft"
) -> dict[str, dict[str, list[str]]]:
    ns = f"pp{world.tag}-scratch"
    sh("ip", "netns", "add", ns)
    world.namespaces.append(ns)
    try:
        world.exec(ns, f"iptables-{backend}-restore", "--noflush", input=restore_text)
        return {
            t: kube_rules(world.exec(ns, f"iptables-{backend}-save", "-t", t).stdout)
            for t in ("filter", "nat")
        }
    finally:
        sh("ip", "netns", "del", ns, check=False)
        world.namespaces.remove(ns)


# Dispatch chains hold one rule per service address and port; those match disjoint packets,
# so their order carries no meaning (partial syncs insert new lines at the head). The one
# exception is KUBE-SERVICES' tail rule, the jump to KUBE-NODEPORTS, which must stay last.
DISPATCH = ("KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-EXTERNAL-SERVICES", "KUBE-PROXY-FIREWALL")


def canonical(rules: dict[str, list[str]]) -> dict[str, list[str]]:
    out = {}
    for chain, lines in rules.items():
        if chain in DISPATCH:
            tail = [lines[-1]] if chain == "KUBE-SERVICES" and lines else []
            out[chain] = sorted(lines[: len(lines) - len(tail)]) + tail
        else:
            out[chain] = lines
    return out
