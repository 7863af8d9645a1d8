"""The one place that runs the iptables tools: restore, save, and jump-rule checks.

Shared by every mode that programs iptables (iptables, ipvs, userspace). Which back end
(nf_tables or legacy) to drive is decided once at start: by flag, or by looking at which
one already holds kube-proxy-style rules, falling back to whichever works (the user-mode
Linux guest has no nf_tables for IPv4, so legacy is what works there).
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

LOCK_WAIT_SECONDS = "5"
BACKENDS = ("nft", "legacy")
PROBE_CHAIN = "PYPROXY-PROBE"
"""Created and deleted at once by the start-up check that a back end can write."""


class IptablesError(RuntimeError):
    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


@dataclass(frozen=True)
class Iptables:
    """Commands for one back end and one IP family."""

    backend: str  # "nft" | "legacy"
    ipv6: bool = False

    def tool(self, suffix: str = "") -> str:
        base = "ip6tables" if self.ipv6 else "iptables"
        return f"{base}-{self.backend}{suffix}"

    @property
    def family_name(self) -> str:
        return "IPv6" if self.ipv6 else "IPv4"

    @property
    def restore_label(self) -> str:
        """How /debug/rules names this tool's transactions: "IPv4 nft iptables-restore"."""
        return f"{self.family_name} {self.backend} iptables-restore"

    def available(self) -> bool:
        return shutil.which(self.tool("-restore")) is not None

    def run(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        cmd = [self.tool(), "-w", LOCK_WAIT_SECONDS, *args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise IptablesError(f"{' '.join(cmd)}: {res.stderr.strip() or res.returncode}")
        return res

    def restore(self, data: str, counters: bool = True) -> None:
        """One atomic iptables-restore --noflush transaction, never cut short (as upstream's:
        a large table's first restore can take minutes, and a cap that killed it would fail
        every retry the same way)."""
        cmd = [self.tool("-restore"), "-w", LOCK_WAIT_SECONDS, "--noflush"]
        if counters:
            cmd.append("--counters")
        res = subprocess.run(cmd, input=data, capture_output=True, text=True)
        if res.returncode != 0:
            # One line for the log: the tool's banner line carries no information.
            lines = [ln.strip() for ln in res.stderr.splitlines() if ln.strip()]
            err = "; ".join(ln for ln in lines if not ln.endswith("(nf_tables):"))
            if not err:
                rc = res.returncode
                err = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
            m = re.search(r"line:? (\d+)", err)
            raise IptablesError(
                f"{self.tool('-restore')} failed: {err}", int(m.group(1)) if m else None
            )

    def save(self, table: str, timeout: float = 120, counters: bool = False) -> str:
        cmd = [self.tool("-save"), "-t", table, *(["-c"] if counters else [])]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if res.returncode != 0:
            raise IptablesError(f"{self.tool('-save')} -t {table}: {res.stderr.strip()}")
        return res.stdout

    def works(self, timeout: float = 20) -> bool:
        """True when this tool can list the nat table here (the IPv6 probe, and the check
        that a back end is usable at all)."""
        if not self.available():
            return False
        try:
            res = self.run("-t", "nat", "-S", "POSTROUTING", check=False, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return res.returncode == 0

    def unusable(self, writes: bool = True) -> str:
        """Why this tool cannot hold pyproxy's rules here ("" when it can): it must list the
        nat table and (``writes``) create a chain in the filter and nat tables."""
        if not self.works():
            return f"{self.tool()} cannot list the nat table"
        return self.write_problem() if writes else ""

    def write_problem(self) -> str:
        """Why a chain cannot be created in the filter or nat table ("" when it can)."""
        for table in ("filter", "nat"):
            try:
                res = self.run("-t", table, "-N", PROBE_CHAIN, check=False)
                if res.returncode == 0 or "exists" in res.stderr:
                    self.run("-t", table, "-X", PROBE_CHAIN, check=False)
                    continue
            except (OSError, subprocess.TimeoutExpired) as err:
                return f"{self.tool()} -t {table} -N: {err}"
            return (
                f"{self.tool()} cannot create a chain in the {table} table: "
                + (res.stderr.strip().splitlines() or ["failed"])[-1]
            )
        return ""

    def chain_exists(self, table: str, chain: str) -> bool:
        return self.run("-t", table, "-S", chain, "1", check=False).returncode == 0

    def ensure_chain(self, table: str, chain: str) -> None:
        if not self.chain_exists(table, chain):
            res = self.run("-t", table, "-N", chain, check=False)
            if res.returncode != 0 and "exists" not in res.stderr:
                raise IptablesError(f"cannot create {table}/{chain}: {res.stderr.strip()}")

    def ensure_rules_first(self, rules: Iterable[tuple[str, str, Sequence[str]]]) -> int:
        """Prepend each (table, chain, args) rule that is missing, in the given order (so
        a later one ends up above an earlier one in the same chain, as repeated
        ``-I chain 1`` would do). Each built-in chain is listed once (``-S``) and a rule
        counts as present only when a listed line equals it exactly. The missing ones go in
        one restore transaction: on the legacy back end every ``iptables`` command reads and
        rewrites the whole table (26 inserts took 3.2 s at 5,000 services). Returns how many
        rules were inserted."""
        listings: dict[tuple[str, str], set[str]] = {}
        missing: dict[str, list[str]] = {}
        for table, chain, args in rules:
            if (table, chain) not in listings:
                res = self.run("-t", table, "-S", chain, check=False)
                listings[(table, chain)] = set(res.stdout.splitlines())
            line = rule_line(chain, args)
            if line not in listings[(table, chain)]:
                missing.setdefault(table, []).append("-I " + line[3:].replace(" ", " 1 ", 1))
                listings[(table, chain)].add(line)
        if missing:
            self.restore(
                "".join(
                    f"*{t}\n" + "\n".join(lines) + "\nCOMMIT\n" for t, lines in missing.items()
                ),
                counters=False,
            )
        return sum(len(lines) for lines in missing.values())

    def delete_rule(self, table: str, chain: str, args: list[str]) -> bool:
        """Delete every copy of a rule; True if one existed."""
        found = False
        while self.run("-t", table, "-D", chain, *args, check=False).returncode == 0:
            found = True
        return found


def rule_line(chain: str, args: Sequence[str]) -> str:
    """``-A CHAIN args`` as iptables -S and iptables-save print it (quoted comments)."""
    return " ".join(["-A", chain, *(f'"{a}"' if " " in a else a for a in args)])


def chains_in_save(save_text: str) -> set[str]:
    return {line[1:].split(" ", 1)[0] for line in save_text.splitlines() if line.startswith(":")}


def _kube_rule_count(ipt: Iptables) -> int:
    try:
        text = ipt.save("nat", timeout=30) + ipt.save("filter", timeout=30)
    except (IptablesError, OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in text.splitlines() if "KUBE-" in line)


def detect_backend(requested: str = "auto", writes: bool = True) -> str:
    """Pick "nft" or "legacy"; raise IptablesError when neither can be used. For a daemon
    (``writes``) the back end chosen must also create (and remove) a chain in the filter and
    nat tables: one that can list but not write (user-mode Linux's nf_tables cannot create
    the ip filter table) would fail every sync, so auto then takes the other one, saying why.
    Only the chosen back end is written to; a read-only tool writes nothing."""
    if requested in BACKENDS:
        why = Iptables(requested).unusable(writes)
        if why:
            raise IptablesError(f"iptables back end {requested!r} is not usable here: {why}")
        return requested
    if requested != "auto":
        raise IptablesError(f"unknown iptables back end {requested!r} (auto, nft, legacy)")
    listing = [b for b in BACKENDS if Iptables(b).works()]
    if not listing:
        raise IptablesError("neither iptables-nft nor iptables-legacy works on this host")
    if len(listing) > 1:
        counts = {b: _kube_rule_count(Iptables(b)) for b in listing}
        if counts["legacy"] > counts["nft"]:
            log.info("iptables: legacy back end holds existing KUBE- rules; preferring it")
            listing.reverse()
    first, *rest = listing  # each lists the nat table; a daemon needs one that can write
    if not writes or not (why := Iptables(first).write_problem()):
        return first
    if rest and not (other := Iptables(rest[0]).write_problem()):
        log.warning("iptables: the %s back end cannot be used here (%s); using %s",
                    first, why, rest[0])  # fmt: skip
        return rest[0]
    raise IptablesError(f"no iptables back end can hold pyproxy's rules here: {why}"
                        + (f"; {other}" if rest else ""))  # fmt: skip


def extract_lines(data: str, line: int, context: int = 2) -> str:
    """The offending restore line with a little context, for the log."""
    lines = data.splitlines()
    lo, hi = max(0, line - 1 - context), min(len(lines), line + context)
    return "\n".join(
        f"{'>' if i + 1 == line else ' '}{i + 1:6d}: {lines[i]}" for i in range(lo, hi)
    )


def working_tables() -> list[Iptables]:
    """Every back end and family that works here (cleanup must reach them all)."""
    out = []
    for backend in BACKENDS:
        for ipv6 in (False, True):
            ipt = Iptables(backend, ipv6=ipv6)
            if ipt.works():
                out.append(ipt)
    return out


def remove_chains(
    ipt: Iptables, table: str, chains: Iterable[str], shared: Iterable[str] = ()
) -> None:
    """Flush and delete ``chains`` in one transaction; chains in ``shared`` (which another
    component may still reference) are removed one by one, and only if unreferenced."""
    shared = set(shared)
    chains = list(chains)
    mine = [c for c in chains if c not in shared]
    if mine:
        text = (
            "\n".join(
                [
                    f"*{table}",
                    *(f":{c} - [0:0]" for c in mine),
                    *(f"-X {c}" for c in mine),
                    "COMMIT",
                ]
            )
            + "\n"
        )
        ipt.restore(text, counters=False)
    for c in chains:
        if c in shared:
            ipt.run("-t", table, "-F", c, check=False)
            if ipt.run("-t", table, "-X", c, check=False).returncode != 0:
                log.info("left %s/%s in place: still referenced by another rule", table, c)
