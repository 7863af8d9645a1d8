"""The typed iptables rule turned into text at the kernel edge: restore input quotes a
comment with a space as iptables-save prints it, an argument vector never quotes, and each
part keeps its place (upstream's rules put ``-m tcp -p tcp -d ... --dport ...`` in that order).
The expected lines are written out by hand from upstream's goldens."""

from __future__ import annotations

from pyproxy.backends.xtables.rule import Match, Module, Rule, comment, ctstate, dport


def test_a_service_rule_reads_as_upstreams() -> None:
    match = (*comment("ns/svc1:p80 cluster IP"), *dport("tcp", 80, "172.30.0.41"))
    rule = Rule("KUBE-SERVICES", match, "KUBE-SVC-XPGD46QRK7WJZT7O")
    assert rule.text == (
        '-A KUBE-SERVICES -m comment --comment "ns/svc1:p80 cluster IP" -m tcp -p tcp '
        "-d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O"
    )
    assert rule.argv() == ["-m", "comment", "--comment", "ns/svc1:p80 cluster IP", "-m", "tcp",
                           "-p", "tcp", "-d", "172.30.0.41", "--dport", "80", "-j",
                           "KUBE-SVC-XPGD46QRK7WJZT7O"]  # fmt: skip


def test_negation_target_arguments_and_flags() -> None:
    rule = Rule("KUBE-POSTROUTING", (Match("-s", "10.0.0.0/8", negated=True),
                                     *ctstate("INVALID", negated=True)),
                "MASQUERADE", ("--random-fully",))  # fmt: skip
    assert rule.text == ("-A KUBE-POSTROUTING ! -s 10.0.0.0/8 -m conntrack ! --ctstate INVALID "
                         "-j MASQUERADE --random-fully")  # fmt: skip
    dnat = Rule("KUBE-SEP-A", (Module("recent"), Match("--name", "KUBE-SEP-A"), Match("--set")),
                "DNAT", ("--to-destination", "10.180.0.1:80"))  # fmt: skip
    assert dnat.spec == ("-m recent --name KUBE-SEP-A --set -j DNAT "
                         "--to-destination 10.180.0.1:80")  # fmt: skip


def test_a_rule_without_a_target_only_counts() -> None:
    rule = Rule("KUBE-FW-X", comment("other traffic to ns/svc:p80 will be dropped"))
    assert (
        rule.text
        == '-A KUBE-FW-X -m comment --comment "other traffic to ns/svc:p80 will be dropped"'
    )
