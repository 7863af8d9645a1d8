"""pyproxy's part of an iptables-save listing, and the differences between two of them."""

from __future__ import annotations

from pyproxy.backends.xtables.compare import differences, own

SAVE = """*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SVC-X - [0:0]
:KUBE-SEP-Y - [0:0]
:DOCKER - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
-A PREROUTING -j KUBE-KUBELET-CANARY
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -m comment --comment "not ours -j KUBE-Y" -j DOCKER
-A PREROUTING -j ACCEPT
-A KUBE-SVC-X -m comment --comment "a/b:c -> 10.1.1.1:80" -j KUBE-SEP-Y
-A KUBE-SEP-Y -p tcp -m comment --comment "a/b:c" -m tcp -j DNAT --to-destination 10.1.1.1:80
COMMIT
"""


def test_own_keeps_kube_chains_and_jumps_to_them_only() -> None:
    """...and not the kubelet's (KUBE-KUBELET-CANARY is on every node)."""
    assert own(SAVE, "nat") == {
        "PREROUTING": [
            '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES'
        ],
        "KUBE-SVC-X": ['-A KUBE-SVC-X -m comment --comment "a/b:c -> 10.1.1.1:80" -j KUBE-SEP-Y'],
        "KUBE-SEP-Y": [
            '-A KUBE-SEP-Y -p tcp -m comment --comment "a/b:c" -m tcp -j DNAT --to-destination '
            "10.1.1.1:80"
        ],
    }


def test_differences_name_the_chain_and_service() -> None:
    want = {"nat": own(SAVE, "nat")}
    have = {"nat": {k: list(v) for k, v in want["nat"].items()}}
    assert differences(want, have, "IPv4") == []
    gone = have["nat"]["KUBE-SEP-Y"].pop()
    del have["nat"]["PREROUTING"][0]
    (sep, top) = differences(want, have, "IPv4")
    assert (sep.service, sep.obj, sep.missing, sep.unexpected) == (
        "a/b",
        "IPv4 nat chain KUBE-SEP-Y",
        (gone,),
        (),
    )
    assert top.obj == "IPv4 nat chain PREROUTING" and top.service == ""  # fmt: skip
    have["nat"]["KUBE-SVC-Z"] = []
    objs = [d.obj for d in differences(want, have, "IPv4")]
    assert objs == ["IPv4 nat chain KUBE-SEP-Y", "IPv4 nat chain KUBE-SVC-Z (not expected)",
                    "IPv4 nat chain PREROUTING"]  # fmt: skip
