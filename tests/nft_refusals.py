"""Transactions the kernel refuses, and near ones it takes, after a common set-up: the unit
suite holds ``pyproxy.kernel.nft_fake.FakeNft`` to them, and ``tests/netns`` holds the
kernel of a namespace to the same list, so the fake refuses exactly what this kernel does."""

from __future__ import annotations

SETUP = """\
add table ip t
add chain ip t a
add chain ip t b
add chain ip t hooked { type filter hook input priority 0 ; }
add set ip t ips { type ipv4_addr ; }
add set ip t nets { type ipv4_addr ; flags interval ; }
add map ip t verdicts { type ipv4_addr . inet_proto . inet_service : verdict ; }
add counter ip t k
add rule ip t a jump b
add rule ip t a ip daddr @ips accept
add rule ip t a counter name k
add element ip t verdicts { 10.0.0.1 . tcp . 80 : goto b }
"""

V = "add element ip t verdicts"

# (what, transaction, refused)
CASES: list[tuple[str, str, bool]] = [
    ("a jump to a missing chain", "add rule ip t b jump absent-chain\n", True),
    ("a jump to a chain added in the same transaction",
     "add chain ip t c\nadd rule ip t b jump c\n", False),
    ("a jump to a base chain", "add rule ip t b jump hooked\n", True),
    ("a map element going to a missing chain",
     f"{V} {{ 10.0.0.2 . tcp . 80 : goto absent-chain }}\n", True),
    ("a map element going to an existing chain",
     f"{V} {{ 10.0.0.2 . udp . 53 : goto a }}\n", False),
    ("deleting a chain a rule jumps to", "delete chain ip t b\n", True),
    ("deleting a chain after the rule and element that use it are gone",
     "flush chain ip t a\ndelete element ip t verdicts { 10.0.0.1 . tcp . 80 }\n"
     "delete chain ip t b\n",
     False),
    ("deleting a chain a map element goes to",
     "flush chain ip t a\ndelete chain ip t b\n", True),
    ("deleting a chain that holds rules nothing jumps to",
     "add chain ip t c\nadd rule ip t c accept\ndelete chain ip t c\n", False),
    ("deleting a missing chain", "delete chain ip t absent-chain\n", True),
    ("flushing a missing chain", "flush chain ip t absent-chain\n", True),
    ("an IPv6 address in an ipv4_addr set", "add element ip t ips { 2001:db8::1 }\n", True),
    ("a prefix in a set without flags interval", "add element ip t ips { 10.0.0.0/8 }\n", True),
    ("a prefix in an interval set", "add element ip t nets { 10.0.0.0/8 }\n", False),
    ("a map key with a part missing", f"{V} {{ 10.0.0.3 . tcp : goto a }}\n", True),
    ("a map element without its value", f"{V} {{ 10.0.0.3 . tcp . 81 }}\n", True),
    ("a port out of range", f"{V} {{ 10.0.0.3 . tcp . 70000 : drop }}\n", True),
    ("a protocol by number", f"{V} {{ 10.0.0.3 . 6 . 80 : drop }}\n", False),
    ("deleting a missing element", "delete element ip t ips { 10.0.0.9 }\n", True),
    ("deleting a set a rule uses", "delete set ip t ips\n", True),
    ("deleting a map a rule uses",
     "add rule ip t b ip daddr . meta l4proto . th dport vmap @verdicts\n"
     "delete map ip t verdicts\n", True),
    ("a rule using a missing set", "add rule ip t b ip daddr @absent-set accept\n", True),
    ("deleting a counter a rule uses", "delete counter ip t k\n", True),
    ("a counter named in quotes", 'add rule ip t b counter name "k"\n', False),
    ("deleting a counter a rule names in quotes",
     'flush chain ip t a\nadd rule ip t b counter name "k"\ndelete counter ip t k\n', True),
    ("a set again with another type", "add set ip t ips { type ipv6_addr ; }\n", True),
    ("a set again with its own type", "add set ip t ips { type ipv4_addr ; }\n", False),
    ("a base chain again with another hook",
     "add chain ip t hooked { type filter hook output priority 0 ; }\n", True),
    ("a base chain again as it is",
     "add chain ip t hooked { type filter hook input priority 0 ; }\n", False),
    ("a chain in a missing table", "add chain ip absent-table c\n", True),
    ("good lines before a refused one", "add chain ip t c\nadd element ip t ips { 10.0.0.7 }\n"
     "add rule ip t c jump absent-chain\n", True),
]  # fmt: skip
