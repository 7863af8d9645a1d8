"""The drift check costs nothing while pyproxy keeps writing: no listing at the look after a
write, a baseline once pyproxy has not written for a period, and then a rule changed by
someone else is seen. Counted, never timed."""

from __future__ import annotations

from pyproxy.backends.xtables.tables import DriftWatch
from pyproxy.kernel.iptables import Iptables

NAT = """*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-A - [0:0]
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-A
-A KUBE-SVC-A -j KUBE-SEP-A
COMMIT
"""


class Listing(Iptables):
    """The legacy back end (no generation: every armed look lists), answering saves from
    ``tables`` and counting them."""

    def __init__(self) -> None:
        super().__init__("legacy")
        object.__setattr__(self, "tables", {"nat": NAT})
        object.__setattr__(self, "saves", 0)

    def save(self, table: str, timeout: float = 120, counters: bool = False) -> str:
        object.__setattr__(self, "saves", self.saves + 1)  # type: ignore[attr-defined]
        return str(self.tables.get(table, f"*{table}\nCOMMIT\n"))  # type: ignore[attr-defined]


def test_no_listing_while_pyproxy_keeps_writing() -> None:
    ipt = Listing()
    watch = DriftWatch(ipt)
    for _ in range(5):  # a write between every two looks: churn
        watch.wrote()
        assert not watch.changed()
    assert ipt.saves == 0 and not watch.armed  # type: ignore[attr-defined]


def test_armed_after_a_quiet_period_then_sees_a_deleted_rule() -> None:
    ipt = Listing()
    watch = DriftWatch(ipt)
    watch.wrote()
    assert not watch.changed() and not watch.armed  # the look right after the write
    assert not watch.changed() and watch.armed  # a quiet period: the baseline
    assert not watch.changed()  # nothing changed
    ipt.tables["nat"] = NAT.replace("-A KUBE-SVC-A -j KUBE-SEP-A\n", "")  # type: ignore[attr-defined]
    assert watch.changed()
    watch.wrote()  # the full sync that repairs it
    assert not watch.changed() and not watch.armed
