"""``pyproxy diff`` for the modes that write iptables: the kernel's copy of pyproxy's chains and
jumps against what it would program now. The expected rule set is loaded into a scratch
network namespace and listed back with the same iptables-save (pyproxy.kernel.scratch), so
both sides are spelled by the tool itself. A service's own chains (SVC, SVL, EXT, FW, SEP)
are compared rule by rule in order (the order carries the probabilities); top-level chains
and built-in chains as multisets (a partial sync inserts a service's lines at the head)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from pyproxy.backends.base import BackendError, Difference, ordered_changes, per_service
from pyproxy.backends.xtables.rules import CANARY_TABLES, KUBE_PROXY_CANARY, JumpRule
from pyproxy.kernel.iptables import Iptables, IptablesError, rule_line
from pyproxy.kernel.scratch import ScratchError, run_in_scratch

TABLES = ("filter", "nat", "mangle")
ORDERED = re.compile(r"^KUBE-(SVC|SVL|EXT|FW|SEP)-")
COMMENT = re.compile(r'--comment "?([^"\s/]+/[^"\s:]+)')
JUMP = re.compile(r" -j (\S+)")
QUOTED = re.compile(r'"[^"]*"')

KUBELET_CHAINS = frozenset({"KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"})
"""KUBE- chains the kubelet makes on every node: not pyproxy's, never a difference."""

Tables = dict[str, dict[str, list[str]]]
"""table -> chain -> rule lines (pyproxy's chains whole; built-in chains: jumps to KUBE-)."""


def own(save: str, table: str) -> dict[str, list[str]]:
    """pyproxy's part of one table as iptables-save prints it: every KUBE- chain with its
    rules, and in built-in chains the rules that jump to a KUBE- chain."""
    chains: dict[str, list[str]] = {}
    for line in save.splitlines():
        if line.startswith(":KUBE-"):
            name = line[1:].split(" ", 1)[0]
            if name not in KUBELET_CHAINS:
                chains.setdefault(name, [])
        elif line.startswith("-A "):
            chain = line.split(" ", 2)[1]
            jump = JUMP.search(QUOTED.sub('""', line))  # not a "-j" inside a comment
            target = jump.group(1) if jump else ""
            if chain in KUBELET_CHAINS or target in KUBELET_CHAINS:
                continue
            if chain.startswith("KUBE-") or target.startswith("KUBE-"):
                chains.setdefault(chain, []).append(line)
    return chains


def expected_text(rendered: str, jumps: Iterable[JumpRule], canary: bool = True) -> str:
    """The render plus the jump rules and (iptables mode) canary chains, as one restore input."""
    extra: dict[str, list[str]] = {
        t: [f":{KUBE_PROXY_CANARY} - [0:0]"] if canary else [] for t in CANARY_TABLES
    }
    for j in jumps:
        extra.setdefault(j.table, []).append(rule_line(j.chain, j.args()))
    return rendered + "".join(
        f"*{t}\n" + "\n".join(lines) + "\nCOMMIT\n" for t, lines in extra.items()
    )


def expected_tables(ipt: Iptables, text: str, prepare: Sequence[Sequence[str]] = ()) -> Tables:
    """``prepare``: commands run first in the scratch namespace (the ipsets IPVS rules match)."""
    steps: list[tuple[Sequence[str], str | None]] = [(argv, None) for argv in prepare]
    steps.append(([ipt.tool("-restore"), "--noflush"], text))
    steps += [([ipt.tool("-save"), "-t", t], None) for t in TABLES]
    try:
        outs = run_in_scratch(steps)
    except ScratchError as err:
        raise BackendError(str(err)) from None
    return {t: own(out, t) for t, out in zip(TABLES, outs[-len(TABLES) :], strict=True)}


def kernel_tables(ipt: Iptables) -> Tables:
    try:
        return {t: own(ipt.save(t), t) for t in TABLES}
    except IptablesError as err:
        raise BackendError(str(err)) from None


def _service(lines: Iterable[str]) -> str:
    for line in lines:
        if m := COMMENT.search(line):
            return m.group(1)
    return ""


def differences(expected: Tables, actual: Tables, family: str) -> list[Difference]:
    out: list[Difference] = []
    for table in TABLES:
        want, have = expected.get(table, {}), actual.get(table, {})
        for chain in sorted(want.keys() | have.keys()):
            w, h = want.get(chain), have.get(chain)
            obj = f"{family} {table} chain {chain}"
            if chain.startswith("KUBE-") and (h is None or w is None):
                what = " (missing)" if h is None else " (not expected)"
                lines = tuple(w or h or ())
                out.append(Difference(_service(lines), obj + what, tuple(w or ()), tuple(h or ())))
                continue
            w, h = w or [], h or []  # a built-in chain: only its jumps to pyproxy's chains
            if ORDERED.match(chain):
                if w != h:
                    out.append(Difference(_service(w + h), obj, *ordered_changes(w, h)))
                continue
            missing, unexpected = Counter(w) - Counter(h), Counter(h) - Counter(w)
            out += per_service(obj, missing.elements(), unexpected.elements(),
                               lambda line: _service([line]))  # fmt: skip
    return out


def compare(
    ipt: Iptables,
    rendered: str,
    jumps: Iterable[JumpRule],
    canary: bool = True,
    prepare: Sequence[Sequence[str]] = (),
    normalize: Callable[[str], str] | None = None,
) -> list[Difference]:
    """The differences for one family (``rendered``: the backend's full restore input).
    ``normalize``: applied to every line of both sides (what only the daemon knows, such as
    the userspace relay's ports)."""
    expected = expected_tables(ipt, expected_text(rendered, jumps, canary), prepare)
    actual = kernel_tables(ipt)
    if normalize is not None:
        expected, actual = (
            {t: {c: [normalize(ln) for ln in lines] for c, lines in chains.items()}
             for t, chains in side.items()}
            for side in (expected, actual)
        )  # fmt: skip
    return differences(expected, actual, ipt.family_name)
