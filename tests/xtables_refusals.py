"""iptables-restore input both back ends refuse, and near ones they take, after a common
set-up: the unit suite holds ``pyproxy.kernel.iptables_fake.FakeIptables`` to them, and
``tests/netns`` holds iptables-nft and iptables-legacy in a namespace to the same list."""

from __future__ import annotations

SETUP = """\
*nat
:KUBE-A - [0:0]
:KUBE-B - [0:0]
-A KUBE-A -m comment --comment "a to b" -j KUBE-B
-A OUTPUT -j KUBE-A
COMMIT
"""


def nat(*lines: str) -> str:
    return "*nat\n" + "".join(f"{line}\n" for line in lines) + "COMMIT\n"


# (what, restore input, refused)
CASES: list[tuple[str, str, bool]] = [
    ("a jump to a missing chain", nat("-A KUBE-B -j KUBE-ABSENT"), True),
    ("a jump to a chain declared later", nat("-A KUBE-B -j KUBE-C", ":KUBE-C - [0:0]"), True),
    ("a jump to a chain declared first", nat(":KUBE-C - [0:0]", "-A KUBE-B -j KUBE-C"), False),
    ("a rule in a missing chain", nat("-A KUBE-ABSENT -j ACCEPT"), True),
    ("a rule without a target", nat('-A KUBE-B -m comment --comment "only counts"'), False),
    ("deleting a chain a rule jumps to", nat("-F KUBE-B", "-X KUBE-B"), True),
    ("deleting a chain once what jumps to it is flushed", nat("-F KUBE-A", "-X KUBE-B"), False),
    ("deleting a chain that holds rules", nat("-D OUTPUT -j KUBE-A", "-X KUBE-A"), True),
    (
        "deleting a flushed chain nothing jumps to",
        nat("-D OUTPUT -j KUBE-A", "-F KUBE-A", "-X KUBE-A"),
        False,
    ),
    ("declaring a chain empties it", nat(":KUBE-A - [0:0]", "-X KUBE-B"), False),
    ("deleting a rule that is not there", nat("-D KUBE-B -j ACCEPT"), True),
    (
        "deleting a rule that is there",
        nat('-D KUBE-A -m comment --comment "a to b" -j KUBE-B'),
        False,
    ),
    ("creating a chain that exists", nat("-N KUBE-B"), True),
    ("flushing a missing chain", nat("-F KUBE-ABSENT"), True),
    ("deleting a missing chain", nat("-X KUBE-ABSENT"), True),
    ("deleting a built-in chain", nat("-X OUTPUT"), True),
    ("inserting past the end", nat("-I KUBE-B 5 -j ACCEPT"), True),
    ("inserting at the head", nat("-I KUBE-A 1 -j ACCEPT"), False),
    ("good lines before a refused one", nat("-N KUBE-C", "-A KUBE-B -j KUBE-ABSENT"), True),
]
