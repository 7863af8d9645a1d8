"""Upstream's network suite as kube-proxy's own CI runs it: e2e.test v1.36.3's ``[sig-network]``
tests with the skip of upstream's kind job for the mode and the IP family, once with upstream
kube-proxy and once with pyproxy, on the real cluster brought up in that family.

    python -m tests.cluster.network_e2e --family ipv4|ipv6|dual [--runs kube-proxy:nftables,...]
                                        [--out DIR] [--procs N] [--focus REGEX] [--list]
                                        [--disruptive] [--loadbalancer]

The jobs (kubernetes/test-infra ``config/jobs/kubernetes/sig-network/sig-network-kind.yaml``,
kind's ``hack/ci/e2e-k8s.sh``) focus ``\\[sig-network\\]|\\[Conformance\\]``; the other
components' ``[Conformance]`` tests are left out here (they do not exercise a proxy). A job
that runs its tests in parallel has ``\\[Serial\\]|`` put before its skip by the script; the
others run Serial tests too (ginkgo runs them last, one at a time). ebpf mode takes the
nftables job's selection (its Service rules are nftables mode's). pyproxy runs privileged,
as kube-proxy does (its conntrack timeouts and localhost NodePorts need it: deploy/privileged).

On top of the job's skip, ``network_e2e_skips.NEVER_HERE`` skips by exact name each test that
would reach outside this machine (the internet), and ``CANNOT_HERE`` each test this cluster
cannot serve for either proxy, each with its reason; both are listed in every summary as
skipped with that reason.

``--loadbalancer`` runs the ``[Feature:LoadBalancer]`` tests every job skips (kind has no
provider) with MetalLB in layer-2 mode as the provider (``tests/cluster/metallb.py``), as a
bare-metal cluster has it.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.cluster import conformance, metallb, real
from tests.cluster.family import FAMILIES
from tests.cluster.network_e2e_skips import CANNOT_HERE, LOADBALANCER_CANNOT, NEVER_HERE

FOCUS = r"\[sig-network\]"
_JOB_SKIP = {
    # (mode, family): (the job, its SKIP, whether it runs in parallel)
    ("iptables", "ipv4"): (
        "ci-kubernetes-kind-network",
        r"Alpha|Beta|LoadBalancer|Disruptive|Flaky|Networking-IPv6|IPv6DualStack|PerformanceDNS",
        False,
    ),
    ("iptables", "ipv6"): (
        "ci-kubernetes-kind-network-ipv6",
        r"Alpha|Beta|LoadBalancer|Disruptive|Flaky|Networking-IPv4|IPv6DualStack"
        r"|Internet.connection|PerformanceDNS|upstream.nameserver|LocalhostNodePorts",
        False,
    ),
    ("iptables", "dual"): (
        "ci-kubernetes-kind-network-dual",
        r"Alpha|Beta|LoadBalancer|Disruptive|Flaky|Networking-IPv6",
        True,
    ),
    ("nftables", "ipv4"): (
        "ci-kubernetes-kind-network-nftables",
        r"Alpha|Beta|LoadBalancer|Disruptive|Flaky|IPv6DualStack|Networking-IPv6"
        r"|Internet.connection|LocalhostNodePorts",
        True,
    ),
    ("nftables", "ipv6"): (
        "ci-kubernetes-kind-network-nftables-ipv6",
        r"Alpha|Beta|LoadBalancer|Disruptive|Flaky|IPv6DualStack|Networking-IPv4"
        r"|Internet.connection|LocalhostNodePorts",
        True,
    ),
    ("nftables", "dual"): (
        "ci-kubernetes-kind-network-nftables-dual",
        r"Alpha|Beta|NetworkPolicy|LoadBalancer|Disruptive|Flaky|IPv6DualStack|Networking-IPv6"
        r"|Internet.connection|LocalhostNodePorts",
        True,
    ),
}

# Upstream's [Disruptive] Services tests that are about the proxy and need only pods (every job
# skips Disruptive): run by --disruptive, beside kube-proxy, in each mode.
DISRUPTIVE = (
    r"\[sig-network\] Services should work after restarting kube-proxy"
    r"|\[sig-network\] Services should work after restarting apiserver"
)


def job(mode: str, fam: str) -> tuple[str, str, bool]:
    """The upstream job whose selection a run in ``mode`` and ``fam`` takes."""
    return _JOB_SKIP[("nftables" if mode == "ebpf" else mode, fam)]


def _exact(name: str) -> str:
    """A test's name as an RE2 pattern that matches it literally."""
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", name)


# Upstream's LoadBalancer tests (test/e2e/network/loadbalancer.go): every job above skips
# them; --loadbalancer runs them with MetalLB as the provider.
LOADBALANCER = r"\[sig-network\] LoadBalancers"
LOADBALANCER_SKIP = "|".join(
    [r"\[Flaky\]|\[Disruptive\]|\[Alpha\]|\[Beta\]", *map(_exact, LOADBALANCER_CANNOT)]
)


def named(mode: str, fam: str) -> dict[str, str]:
    """The tests a run skips by name, with the reason: those the job's own skip leaves in."""
    _, skip, _ = job(mode, fam)
    return {n: why for n, why in {**NEVER_HERE, **CANNOT_HERE}.items() if not re.search(skip, n)}


def skip_for(mode: str, fam: str) -> str:
    """The ginkgo skip of a run: the job's, Serial before it if the job runs in parallel, and
    the tests skipped here by name."""
    _, skip, parallel = job(mode, fam)
    exact = [_exact(n) for n in named(mode, fam)]
    return "|".join([*([r"\[Serial\]"] if parallel else []), skip, *exact])


def listed(focus: str, skip: str) -> list[str]:
    """The tests a run selects, from e2e.test's dry run (its JUnit report: a selected spec
    is reported passed, every other skipped)."""
    with tempfile.TemporaryDirectory() as d:
        report = Path(d) / "dry.xml"
        subprocess.run(
            [
                str(real.NODE_BIN / "e2e.test"),
                "--ginkgo.dry-run",
                "--ginkgo.no-color",
                f"--ginkgo.focus={focus}",
                f"--ginkgo.skip={skip}",
                f"--ginkgo.junit-report={report}",
            ],
            capture_output=True,
            check=False,
            timeout=300,
        )
        cases = ET.parse(report).getroot().iter("testcase")
        selected = (
            conformance.case_name(c)
            for c in cases
            if c.find("skipped") is None and c.get("status") != "skipped"
        )
        return sorted(n for n in selected if re.search(focus, n))  # not the suite's own nodes


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.cluster.network_e2e")
    ap.add_argument("--family", choices=list(FAMILIES), default="ipv4")
    ap.add_argument(
        "--runs",
        default="kube-proxy:iptables,pyproxy:iptables,kube-proxy:nftables,pyproxy:nftables,"
        "pyproxy:ebpf",
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--focus", default=FOCUS, help="a narrower selection (a test's name: one test)")
    ap.add_argument("--list", action="store_true", help="print each mode's selection and stop")
    ap.add_argument(
        "--disruptive",
        action="store_true",
        help="run upstream's two Disruptive Services tests about the proxy instead",
    )
    ap.add_argument(
        "--loadbalancer",
        action="store_true",
        help="run upstream's LoadBalancer tests instead, with MetalLB as the provider",
    )
    a = ap.parse_args(argv)
    runs = [(p, m) for p, _, m in (r.partition(":") for r in a.runs.split(","))]
    if a.list:
        if a.loadbalancer:
            names = listed(LOADBALANCER, LOADBALANCER_SKIP)
            print(f"# LoadBalancer tests with MetalLB: {len(names)} tests")
            print("\n".join(names))
            return 0
        for mode in dict.fromkeys(m for _, m in runs):
            names = listed(a.focus, skip_for(mode, a.family))
            print(f"# {mode} {a.family} ({job(mode, a.family)[0]}): {len(names)} tests")
            print("\n".join(names))
        return 0
    kind = "disruptive" if a.disruptive else a.family
    if a.loadbalancer:
        kind = f"loadbalancer-{a.family}"
    out = (a.out or real.ROOT / "build" / "network-e2e" / kind).resolve()
    if a.disruptive:
        conformance.run_all(
            "network-e2e-disruptive",
            runs,
            a.family,
            DISRUPTIVE,
            lambda mode: r"\[Flaky\]",
            out,
            1,
            suffix=f" {a.family}",
            privileged=True,
        )
        return 0
    if a.loadbalancer:
        conformance.run_all(
            "network-e2e-loadbalancer",
            runs,
            a.family,
            LOADBALANCER if a.focus == FOCUS else a.focus,
            lambda mode: LOADBALANCER_SKIP,
            out,
            a.procs,
            lambda mode: LOADBALANCER_CANNOT,
            suffix=f" {a.family}",
            privileged=True,
            prepare=metallb.install,
        )
        return 0
    conformance.run_all(
        "network-e2e",
        runs,
        a.family,
        a.focus,
        lambda mode: skip_for(mode, a.family),
        out,
        a.procs,
        lambda mode: named(mode, a.family),
        suffix=f" {a.family}",
        privileged=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
