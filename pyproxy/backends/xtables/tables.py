"""Applying iptables rules for any mode, through the kernel layer: which back end and
families to drive, jump rules into built-in chains, the canary, and removing a mode's
chains and jumps from every back end (``pyproxy cleanup``)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from pyproxy.backends.base import BackendError, BackendUnavailable
from pyproxy.backends.xtables.compare import own
from pyproxy.backends.xtables.rules import CANARY_TABLES, KUBE_PROXY_CANARY, JumpRule
from pyproxy.kernel import nft
from pyproxy.kernel.iptables import (
    Iptables,
    IptablesError,
    chains_in_save,
    detect_backend,
    remove_chains,
    working_tables,
)
from pyproxy.model.types import IPFamily

log = logging.getLogger(__name__)


def open_tables(
    requested: str, families: Iterable[IPFamily], mode: str, writes: bool = True
) -> dict[IPFamily, Iptables]:
    """The iptables commands for each family that works here, all on one back end (for a
    read-only tool, ``writes=False``: nothing is written to find it).

    No usable back end at all is BackendUnavailable; an IP family whose tool does not work
    (ip6tables without IPv6 support) is left out with a warning, as upstream does."""
    try:
        backend = detect_backend(requested, writes=writes)
    except IptablesError as err:
        raise BackendUnavailable(str(err)) from None
    out: dict[IPFamily, Iptables] = {}
    for family in families:
        ipt = Iptables(backend, ipv6=family is IPFamily.IPV6)
        if family is IPFamily.IPV6 and not ipt.works():
            log.warning("ip6tables (%s) does not work here; IPv6 services are not proxied", backend)
            continue
        out[family] = ipt
    log.info("%s mode: iptables %s back end for %s", mode, backend, ", ".join(f.value for f in out))
    return out


def ensure_jumps(
    ipt: Iptables, jumps: Sequence[JumpRule], declared: Collection[tuple[str, str]] = ()
) -> None:
    """Make sure every jump exists (prepended in list order, as upstream's EnsureRule).

    Target chains in ``declared`` (table, chain) were just written by a restore; others are
    created empty if missing, never flushed (another program may own them)."""
    try:
        for table, target in dict.fromkeys((j.table, j.target) for j in jumps):
            if (table, target) not in declared:
                ipt.ensure_chain(table, target)
        n = ipt.ensure_rules_first((j.table, j.chain, j.args()) for j in jumps)
    except IptablesError as err:
        raise BackendError(f"cannot install jump rules: {err}") from None
    if n:
        log.info("inserted %d jump rules (%s)", n, ipt.family_name)


def ensure_canary(ipt: Iptables) -> None:
    try:
        for table in CANARY_TABLES:
            ipt.ensure_chain(table, KUBE_PROXY_CANARY)
    except IptablesError as err:
        raise BackendError(f"cannot create {KUBE_PROXY_CANARY}: {err}") from None


class DriftWatch:
    """Notices pyproxy's rules changed or deleted by someone else, one rule as well as a flush
    (the canary only shows the latter): pyproxy's lines in the kernel (every ``KUBE-`` chain
    and jump, as iptables-save prints them, without counters) against a baseline listing. A
    listing costs a save (0.56 s at 10,000 services), so:

    - the baseline is taken at a look with no write of pyproxy's since the previous look, never
      at the look right after a write: while changes keep coming (a large cluster's steady
      state) a baseline would be stale a second later, and listing the whole table every
      period to take it cost most of pyproxy's CPU under churn (measured: README, "CPU under
      churn"); the check is armed again once pyproxy has not written for a period;
    - once armed, on the nf_tables back end a look lists only when the ruleset generation
      moved since the last look (any write to any table moves it; reading does not); the
      legacy back end has no generation and is listed at every look.

    A change made by someone else while pyproxy keeps writing is seen by the canary (a
    flush) and by the next full sync, not here."""

    def __init__(self, ipt: Iptables) -> None:
        self.ipt = ipt
        self._generation: int | None = None
        self._snapshot: Counter[str] | None = None
        self._wrote = True

    @property
    def armed(self) -> bool:
        """Whether a baseline is held, so that the next look can see a change."""
        return self._snapshot is not None

    def wrote(self) -> None:
        """pyproxy wrote: the baseline is stale, and the next look does not take another."""
        self._snapshot = None
        self._generation = None
        self._wrote = True

    def changed(self) -> bool:
        if self._wrote:
            self._wrote = False
            return False
        gen = nft.generation() if self.ipt.backend == "nft" else None
        if gen is not None and gen == self._generation:
            return False
        try:
            lines = own_lines(self.ipt)
        except (OSError, IptablesError) as err:
            log.warning("cannot list the rules to look for changes by others: %s", err)
            return False
        self._generation = gen
        if self._snapshot is None:
            self._snapshot = lines
            return False
        return lines != self._snapshot


def own_lines(ipt: Iptables) -> Counter[str]:
    """pyproxy's chains and rules in the kernel (``compare.own``), as a multiset: a partial
    sync inserts a service's top-level lines at the head, so their order carries no meaning."""
    out: Counter[str] = Counter()
    for table in dict.fromkeys(("filter", "nat", *CANARY_TABLES)):
        for chain, lines in own(ipt.save(table), table).items():
            out[f"{table} :{chain}"] += 1
            out.update(f"{table} {line}" for line in lines)
    return out


def canary_present(ipt: Iptables) -> bool:
    """False when someone flushed or deleted pyproxy's rules (the mangle canary is gone)."""
    try:
        return ipt.chain_exists("mangle", KUBE_PROXY_CANARY)
    except (OSError, IptablesError):
        return False


ChainSelector = Collection[str] | Callable[[str], bool]


def cleanup_everywhere(
    jumps: Sequence[JumpRule],
    chains: Mapping[str, ChainSelector],
    shared: Collection[str] = (),
    families: Collection[IPFamily] = (IPFamily.IPV4, IPFamily.IPV6),
    canary: bool = False,
) -> None:
    """Remove a mode's jump rules, then its chains (per table: names, or a predicate on
    names), from every back end and family that works here. Chains in ``shared`` are
    removed only when nothing else references them. Raises BackendError listing failures."""
    errors = []
    for ipt in working_tables():
        if (IPFamily.IPV6 if ipt.ipv6 else IPFamily.IPV4) not in families:
            continue
        try:
            _cleanup(ipt, jumps, chains, shared, canary)
        except (OSError, IptablesError) as err:
            errors.append(f"{ipt.backend}/{ipt.family_name}: {err}")
    if errors:
        raise BackendError("; ".join(errors))


def _cleanup(
    ipt: Iptables,
    jumps: Sequence[JumpRule],
    chains: Mapping[str, ChainSelector],
    shared: Collection[str],
    canary: bool,
) -> None:
    for j in jumps:
        ipt.delete_rule(j.table, j.chain, j.args())
    for table, selector in chains.items():
        present = chains_in_save(ipt.save(table))
        pick = selector if callable(selector) else selector.__contains__
        remove_chains(ipt, table, sorted(c for c in present if pick(c)), shared=shared)
    if canary:
        for table in CANARY_TABLES:
            if ipt.chain_exists(table, KUBE_PROXY_CANARY):
                ipt.run("-t", table, "-X", KUBE_PROXY_CANARY, check=False)
