"""An endpoint chain held as its facts reads as the two rules upstream writes, both as rules
(what ``trace`` walks) and as restore lines filled into the port's template (what a full sync
writes): with and without the port's comment (a large table has none), with session
affinity (whose ``recent`` match names the chain), and for IPv6. The expected lines are
written out by hand from upstream's goldens (pkg/proxy/iptables/proxier_test.go)."""

from __future__ import annotations

import pytest

from pyproxy.backends.iptables.endpoint_chain import EndpointChain, EndpointRules, lines
from pyproxy.backends.xtables.rule import Rule, comment

SEP = "KUBE-SEP-I77PXRDZVX7PMWMN"

CASES = [
    pytest.param(
        EndpointRules(comment("ns5/svc5:p80"), "tcp", affinity=False),
        ("10.180.0.3", "10.180.0.3:80"),
        [f"-A {SEP} -m comment --comment ns5/svc5:p80 -s 10.180.0.3 -j KUBE-MARK-MASQ",
         f"-A {SEP} -m comment --comment ns5/svc5:p80 -m tcp -p tcp -j DNAT "
         "--to-destination 10.180.0.3:80"],
        id="commented",
    ),
    pytest.param(
        EndpointRules(comment("ns5/svc5:p80"), "tcp", affinity=True),
        ("10.180.0.3", "10.180.0.3:80"),
        [f"-A {SEP} -m comment --comment ns5/svc5:p80 -s 10.180.0.3 -j KUBE-MARK-MASQ",
         f"-A {SEP} -m comment --comment ns5/svc5:p80 -m recent --name {SEP} --set "
         "-m tcp -p tcp -j DNAT --to-destination 10.180.0.3:80"],
        id="affinity",
    ),
    pytest.param(
        EndpointRules((), "udp", affinity=False),
        ("10.180.0.3", "10.180.0.3:53"),
        [f"-A {SEP} -s 10.180.0.3 -j KUBE-MARK-MASQ",
         f"-A {SEP} -m udp -p udp -j DNAT --to-destination 10.180.0.3:53"],
        id="large",
    ),
    pytest.param(
        EndpointRules((), "sctp", affinity=True),
        ("fd00:10:180::3", "[fd00:10:180::3]:80"),
        [f"-A {SEP} -s fd00:10:180::3 -j KUBE-MARK-MASQ",
         f"-A {SEP} -m recent --name {SEP} --set -m sctp -p sctp -j DNAT "
         "--to-destination [fd00:10:180::3]:80"],
        id="large-affinity-ipv6",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("port", "endpoint", "expected"), CASES)
def test_an_endpoint_chain_reads_as_upstreams_two_rules(
    port: EndpointRules, endpoint: tuple[str, str], expected: list[str]
) -> None:
    chain = EndpointChain(port, SEP, *endpoint)
    assert [r.text for r in chain] == expected
    assert lines(chain) == expected
    assert len(chain) == 2 and [chain[0], chain[1]] == list(chain)


def test_an_endpoint_chain_equals_the_same_rules_in_a_list() -> None:
    port = EndpointRules((), "tcp", affinity=False)
    chain = EndpointChain(port, SEP, "10.180.0.3", "10.180.0.3:80")
    assert chain == list(chain)
    assert chain != list(EndpointChain(port, SEP, "10.180.0.4", "10.180.0.4:80"))
    assert lines([Rule(SEP, (), "KUBE-MARK-MASQ")]) == [f"-A {SEP} -j KUBE-MARK-MASQ"]
