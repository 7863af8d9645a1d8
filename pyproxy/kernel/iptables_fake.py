"""A checking stand-in for the xtables port (``Iptables``), for unit tests: it keeps each
table's chains and rules in memory, takes ``iptables-restore --noflush`` input, and refuses,
as both back ends do here (measured: ``tests/netns/test_xtables_refusals.py``), a jump to a
chain that does not exist yet, a rule in a missing chain, deleting a chain that still holds
rules or that a rule jumps to, deleting a built-in chain, ``-D`` of a rule that is not
there, ``-N`` of a chain that exists, ``-F`` of one that does not, and an insertion index
past the end. A refused transaction changes nothing. Declaring an existing chain
(``:KUBE-X - [0:0]``) empties it, as the tools do.

It answers ``save`` from what it holds, so the backends' listings (stale chains, drift)
read what was written; it runs no program.
"""

from __future__ import annotations

import copy
import shlex
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pyproxy.kernel.iptables import Iptables, IptablesError, rule_line

BUILTIN: dict[str, tuple[str, ...]] = {
    "filter": ("INPUT", "FORWARD", "OUTPUT"),
    "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"),
    "mangle": ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"),
    "raw": ("PREROUTING", "OUTPUT"),
}
TARGETS = frozenset({
    "ACCEPT", "DROP", "RETURN", "REJECT", "DNAT", "SNAT", "MASQUERADE", "MARK", "REDIRECT",
    "LOG", "CONNMARK", "NOTRACK", "CT",
})  # fmt: skip
"""Targets that are extensions, not chains."""


class _Refused(Exception):
    pass


def _target(args: Sequence[str]) -> str | None:
    for flag in ("-j", "--jump", "-g", "--goto"):
        if flag in args:
            i = args.index(flag)
            return args[i + 1] if i + 1 < len(args) else None
    return None


@dataclass(frozen=True, eq=False)
class FakeIptables(Iptables):
    """One family's tables in memory (see the module)."""

    backend: str = "nft"
    tables: dict[str, dict[str, list[str]]] = field(
        default_factory=lambda: {t: {c: [] for c in cs} for t, cs in BUILTIN.items()}
    )
    """table -> chain -> its rules, each as ``iptables-save`` prints it without ``-A CHAIN``."""
    restores: list[str] = field(default_factory=list)
    """Every transaction taken, in order."""
    counters: dict[tuple[str, str, int], tuple[int, int]] = field(default_factory=dict)
    """(table, chain, rule index) -> (packets, bytes), as a test sets them; ``save -c``."""

    # ---- the port -----------------------------------------------------------------------

    def available(self) -> bool:
        return True

    def works(self, timeout: float = 20) -> bool:
        return True

    def unusable(self, writes: bool = True) -> str:
        return ""

    def run(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError("the fake runs no iptables program; use its port methods")

    def restore(self, data: str, counters: bool = True) -> None:
        before = copy.deepcopy(self.tables)
        table: dict[str, list[str]] | None = None
        name = ""
        for n, raw in enumerate(data.splitlines(), 1):
            line = raw.strip()
            try:
                if not line or line.startswith("#"):
                    continue
                if line.startswith("*"):
                    name = line[1:]
                    table = self.tables.setdefault(name, {})
                elif line == "COMMIT":
                    table = None
                elif table is None:
                    raise _Refused("a command outside a table")
                elif line.startswith(":"):
                    chain = line[1:].split(" ", 1)[0]
                    table[chain] = []  # a declaration empties an existing chain
                else:
                    self._command(name, table, shlex.split(line))
            except _Refused as err:
                self.tables.clear()
                self.tables.update(before)
                raise IptablesError(
                    f"{self.tool('-restore')} failed: line {n} failed: {err}", n
                ) from None
        self.restores.append(data)

    def save(self, table: str, timeout: float = 120, counters: bool = False) -> str:
        chains = self.tables.get(table, {})
        builtin = BUILTIN.get(table, ())
        out = [f"*{table}"]
        out += [f":{c} {'ACCEPT' if c in builtin else '-'} [0:0]" for c in chains]
        for c, rules in chains.items():
            for i, r in enumerate(rules):
                line = rule_line(c, shlex.split(r))
                if counters:
                    packets, octets = self.counters.get((table, c, i), (0, 0))
                    line = f"[{packets}:{octets}] {line}"
                out.append(line)
        return "\n".join([*out, "COMMIT"]) + "\n"

    def chain_exists(self, table: str, chain: str) -> bool:
        return chain in self.tables.get(table, {})

    def ensure_chain(self, table: str, chain: str) -> None:
        self.tables.setdefault(table, {}).setdefault(chain, [])

    def ensure_rules_first(self, rules: Iterable[tuple[str, str, Sequence[str]]]) -> int:
        lines: dict[str, list[str]] = {}
        for table, chain, args in rules:
            rule = rule_line(chain, args)[len(f"-A {chain} ") :]
            have = self.tables.get(table, {}).get(chain, [])
            insert = f"-I {chain} 1 {rule}"
            if rule not in have and insert not in lines.get(table, []):
                lines.setdefault(table, []).append(insert)
        if lines:
            self.restore("".join(f"*{t}\n" + "\n".join(ls) + "\nCOMMIT\n"
                                 for t, ls in lines.items()))  # fmt: skip
        return sum(len(ls) for ls in lines.values())

    def delete_rule(self, table: str, chain: str, args: list[str]) -> bool:
        rules = self.tables.get(table, {}).get(chain, [])
        rule = rule_line(chain, args)[len(f"-A {chain} ") :]
        found = rule in rules
        rules[:] = [r for r in rules if r != rule]
        return found

    # ---- commands -----------------------------------------------------------------------

    def _command(self, name: str, table: dict[str, list[str]], words: list[str]) -> None:
        if len(words) < 2:
            raise _Refused("syntax error")
        op, chain, args = words[0], words[1], words[2:]
        builtin = BUILTIN.get(name, ())
        if op == "-N":
            if chain in table:
                raise _Refused("Chain already exists.")
            table[chain] = []
            return
        if chain not in table:
            raise _Refused("No chain/target/match by that name.")
        rules = table[chain]
        if op == "-F":
            rules.clear()
        elif op == "-X":
            if chain in builtin:
                raise _Refused(f"cannot delete built-in chain {chain}")
            if rules:
                raise _Refused(f"Device or resource busy: chain {chain} holds rules")
            users = [c for c, rs in table.items() if c != chain
                     for r in rs if _target(shlex.split(r)) == chain]  # fmt: skip
            if users:
                raise _Refused(f"Device or resource busy: chain {chain} is used by {users[0]}")
            del table[chain]
        elif op in ("-A", "-I"):
            index = len(rules)
            if op == "-I":
                index = 0
                if args and args[0].isdigit():
                    index, args = int(args[0]) - 1, args[1:]
                    if index > len(rules):
                        raise _Refused("Index of insertion too big.")
            target = _target(args)
            if target is not None and target not in TARGETS and target not in table:
                raise _Refused(f"Chain '{target}' does not exist")
            rules.insert(index, rule_line(chain, args)[len(f"-A {chain} ") :])
        elif op == "-D":
            rule = rule_line(chain, args)[len(f"-A {chain} ") :]
            if rule not in rules:
                raise _Refused("Bad rule (does a matching rule exist in that chain?).")
            rules.remove(rule)
        else:
            raise _Refused(f"unsupported command {op}")
