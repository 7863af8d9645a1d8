"""MetalLB as the real cluster's LoadBalancer provider, the way a bare-metal cluster has one:
its controller assigns each LoadBalancer Service an address from a pool on the nodes' own
network, and its speaker, in layer-2 mode, answers ARP (IPv4) and neighbour solicitations
(IPv6) for that address from one node. The lan namespace, where the control plane and e2e.test
run, is the client outside the cluster: its packets to the address, sent from an address
outside the nodes' network (family.py: ``client_ip``), reach the announcing node, whose
Service proxy takes them.

    python -m tests.cluster.metallb install     (on the cluster that is up, in its family)
    python -m tests.cluster.metallb remove

MetalLB v0.16.1's own manifest (``config/manifests/metallb-native.yaml``, copied by
``build.sh metallb``) is applied with two changes: no admission or conversion webhooks (the API
server runs in the lan namespace, outside the cluster's Service network, so it cannot call a
webhook behind a Service; the controller runs with ``--webhook-mode=disabled``). The pools are
the upper part of the lan's range in each family of the cluster, which nothing else uses.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from tests.cluster import family as families
from tests.cluster import host, real
from tests.cluster.cluster import CACHE

VERSION = "v0.16.1"
DIR = CACHE / f"metallb-{VERSION}"
NAMESPACE = "metallb-system"
ARCHIVES = ("metallb-controller", "metallb-speaker")


def pool_range(s: families.Stack) -> str:
    """The addresses MetalLB hands out in one family: the lan's .200 to .250 (IPv6: ::200 to
    ::250), above the lan's router and nodes (family.py: ``lb_range``)."""
    return "-".join(s.lb_range)


def manifests(fam: str) -> list[dict[str, Any]]:
    """Upstream's manifest less its webhooks, then a pool of each family and the layer-2
    advertisement of every pool."""
    src = DIR / "metallb-native.yaml"
    if not src.exists():
        raise SystemExit(f"missing {src}: run tests/cluster/build.sh metallb")
    docs = [d for d in yaml.safe_load_all(src.read_text()) if d]
    out = []
    for d in docs:
        if d["kind"] == "ValidatingWebhookConfiguration":
            continue
        if d["kind"] == "CustomResourceDefinition" and "conversion" in d["spec"]:
            d["spec"]["conversion"] = {"strategy": "None"}
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "controller":
            c = d["spec"]["template"]["spec"]["containers"][0]
            c["args"] = [*c["args"], "--webhook-mode=disabled"]
        out.append(d)
    out.append(
        {
            "apiVersion": "metallb.io/v1beta1",
            "kind": "IPAddressPool",
            "metadata": {"name": "lan", "namespace": NAMESPACE},
            "spec": {"addresses": [pool_range(s) for s in families.stacks(fam)]},
        }
    )
    out.append(
        {
            "apiVersion": "metallb.io/v1beta1",
            "kind": "L2Advertisement",
            "metadata": {"name": "lan", "namespace": NAMESPACE},
            "spec": {"ipAddressPools": ["lan"]},
        }
    )
    return out


def _import_images() -> None:
    """The controller's and speaker's images on each node (a cluster brought up before they
    were built has not imported them at start)."""
    archives = [real.IMAGES / f"{name}.tar" for name in ARCHIVES]
    for archive in archives:
        if not archive.exists():
            raise SystemExit(f"missing {archive}: run tests/cluster/images.sh")
    for n in real.nodes():
        n.import_images(real.holder(), real.NODE_BIN, archives)


def install() -> None:
    """MetalLB up and announcing: its controller Ready and a speaker Ready on every node."""
    if not real.running():
        raise SystemExit("no cluster is up: python -m tests.cluster.real up --family ...")
    fam = real.family()
    _import_images()
    docs = manifests(fam)
    crds = [d for d in docs if d["kind"] in ("Namespace", "CustomResourceDefinition")]
    rest = [d for d in docs if d not in crds]
    # The pool and advertisement need their CRDs established first.
    real.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(crds))
    real.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s", timeout=90)
    real.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(rest))
    for what in ("deployment/controller", "daemonset/speaker"):
        real.kubectl("rollout", "status", what, "-n", NAMESPACE, "--timeout=180s", timeout=200)
    host.log(
        f"MetalLB {VERSION} layer 2: pools "
        + ", ".join(pool_range(s) for s in families.stacks(fam))
    )


def remove() -> None:
    """Everything :func:`install` made (the namespace holds the pools and the daemons)."""
    real.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=120s")
    crds = [
        d["metadata"]["name"]
        for d in manifests(real.family())
        if d["kind"] == "CustomResourceDefinition"
    ]
    real.kubectl("delete", "crd", "--ignore-not-found", *crds)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.cluster.metallb")
    ap.add_argument("action", choices=("install", "remove"))
    a = ap.parse_args(argv)
    install() if a.action == "install" else remove()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
