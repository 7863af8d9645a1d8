"""The checking fake of the xtables port refuses what both iptables back ends refuse (the
list ``tests/netns/test_xtables_refusals.py`` holds this machine's tools to), and a refused
transaction changes nothing in it."""

from __future__ import annotations

import copy

import pytest

from pyproxy.kernel.iptables import IptablesError
from pyproxy.kernel.iptables_fake import FakeIptables
from tests.xtables_refusals import CASES, SETUP


@pytest.mark.parametrize(("what", "text", "refused"), CASES, ids=[c[0] for c in CASES])
def test_the_fake_refuses_what_iptables_refuses(what: str, text: str, refused: bool) -> None:
    ipt = FakeIptables()
    ipt.restore(SETUP)
    before = copy.deepcopy(ipt.tables)
    if refused:
        with pytest.raises(IptablesError) as err:
            ipt.restore(text)
        assert err.value.line is not None
        assert ipt.tables == before, f"{what}: a refused transaction changed the fake"
    else:
        ipt.restore(text)
        assert ipt.restores == [SETUP, text]


def test_the_fake_saves_what_it_holds() -> None:
    ipt = FakeIptables()
    ipt.restore(SETUP)
    assert ipt.save("nat") == (
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n"
        ":POSTROUTING ACCEPT [0:0]\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\n-A OUTPUT -j KUBE-A\n"
        '-A KUBE-A -m comment --comment "a to b" -j KUBE-B\nCOMMIT\n'
    )
    assert ipt.ensure_rules_first([("nat", "PREROUTING", ["-j", "KUBE-A"])] * 2) == 1
    assert ipt.tables["nat"]["PREROUTING"] == ["-j KUBE-A"]
