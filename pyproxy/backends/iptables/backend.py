"""The iptables backend: renders with ``render`` and applies through the iptables toolkit.

Each sync is one ``iptables-restore --noflush`` transaction per IP family, holding the filter
and nat tables, so the kernel never shows half a rule set and a failed restore leaves the
previous rules in place.

Partial syncs are cheaper than upstream's: upstream rewrites KUBE-SERVICES (one rule per
service address) on every sync, which on the nf_tables back end costs as much as the whole
table (1.77 s vs 0.08 s at 10,000 services, ../shared/reference/kernel-facts.md). Here a
partial sync rewrites only the changed services' own chains and turns the top-level chains'
changes into ``-D``/``-I`` of just the lines that changed; the tail rule of KUBE-SERVICES
(the NodePort jump) never moves because new lines are inserted at the head. If a partial
restore fails (drift: a rule we expected is gone) the same sync falls back to a full one.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

from prometheus_client import CollectorRegistry, Gauge

from pyproxy.backends.base import Backend, BackendError, SyncRequest, SyncResult
from pyproxy.backends.iptables import names
from pyproxy.backends.iptables.render import (
    FILTER_TOP,
    JUMP_RULES,
    KUBE_FIREWALL,
    KUBE_SERVICES,
    KUBELET_FIREWALL_JUMPS,
    NAT_TOP,
    IptablesConfig,
    Rendered,
    render,
)
from pyproxy.backends.metrics import FAMILY, RestoreFailures, SyncDurations
from pyproxy.backends.stale_conntrack import stale_filters
from pyproxy.backends.xtables.rules import KUBE_MARK_MASQ, KUBE_PROXY_CANARY
from pyproxy.backends.xtables.tables import (
    canary_present,
    cleanup_everywhere,
    ensure_canary,
    ensure_jumps,
    open_tables,
)
from pyproxy.config.settings import ProxyConfig
from pyproxy.kernel import addresses, conntrack, sysctl
from pyproxy.kernel.iptables import Iptables, IptablesError, chains_in_save, extract_lines
from pyproxy.model.types import IPFamily, NamespacedName, ProxyState

log = logging.getLogger(__name__)

FAMILIES = (IPFamily.IPV4, IPFamily.IPV6)


@dataclass
class _Family:
    cfg: IptablesConfig
    ipt: Iptables
    last: Rendered | None = None
    last_state: ProxyState | None = None

    @property
    def family(self) -> IPFamily:
        return self.cfg.family


def _spec(line: str) -> str:
    """'-A CHAIN args' -> 'CHAIN args'."""
    return line[3:]


def _chain_delta(chain: str, old: list[str], new: list[str]) -> tuple[list[str], list[str]]:
    """(declarations, commands) that turn ``old`` into ``new`` with the fewest rule writes."""
    if old == new:
        return [], []
    removed = Counter(old) - Counter(new)
    added = Counter(new) - Counter(old)
    tail_moved = bool(old) and bool(new) and old[-1] != new[-1] and chain == KUBE_SERVICES
    if tail_moved or sum(removed.values()) + sum(added.values()) >= max(len(new), 8):
        return [f":{chain} - [0:0]"], list(new)
    cmds = [f"-D {_spec(line)}" for line in _take(old, removed)]
    new_lines = _take(new, added)
    # Insert at the head in reverse so the new lines keep their relative order.
    cmds += [f"-I {chain} 1 {_spec(line)[len(chain) + 1 :]}" for line in reversed(new_lines)]
    return [], cmds


def _take(lines: list[str], wanted: Counter[str]) -> list[str]:
    """The first ``wanted[line]`` occurrences of each line, in order."""
    left = Counter(wanted)
    out = []
    for line in lines:
        if left[line] > 0:
            left[line] -= 1
            out.append(line)
    return out


def partial_text(old: Rendered, new: Rendered, changed: Iterable[NamespacedName]) -> str:
    """iptables-restore input that moves the kernel from ``old`` to ``new`` touching only
    ``changed`` services' chains and the changed lines of the top-level chains."""
    changed = set(changed)
    out = ["*filter"]
    decls: list[str] = []
    cmds: list[str] = []
    for chain in new.filter_chain_names():
        d, c = _chain_delta(chain, old.filter_top.get(chain, []), new.filter_top.get(chain, []))
        decls += d
        cmds += c
    out += decls + cmds + ["COMMIT", "*nat"]
    decls, cmds, own_rules, deletes = [], [], [], []
    active = new.service_chains()
    for svc in sorted(changed):
        for chain, lines in new.services[svc].chains.items() if svc in new.services else ():
            decls.append(f":{chain} - [0:0]")
            own_rules += lines
        for chain in old.services[svc].chains if svc in old.services else ():
            if chain not in active:
                decls.append(f":{chain} - [0:0]")
                deletes.append(f"-X {chain}")
    for chain in NAT_TOP:
        d, c = _chain_delta(chain, old.nat_top.get(chain, []), new.nat_top.get(chain, []))
        decls += d
        cmds += c
    out += decls + cmds + own_rules + deletes + ["COMMIT"]
    return "\n".join(out) + "\n"


def _written(text: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    table = ""
    for line in text.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(("-A ", "-I ")):
            counts[table] += 1
    return counts


class IptablesMetrics:
    """The families upstream registers for iptables mode."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.durations = SyncDurations(registry)
        self.restore_failures = RestoreFailures(registry, partial=True)
        self.rules_total = Gauge(
            "kubeproxy_sync_proxy_rules_iptables_total",
            "Total number of iptables rules owned by kube-proxy",
            ("table", *FAMILY),
            registry=registry,
        )
        self.rules_last = Gauge(
            "kubeproxy_sync_proxy_rules_iptables_last",
            "Number of iptables rules written by kube-proxy in last sync",
            ("table", *FAMILY),
            registry=registry,
        )


class IptablesBackend(Backend):
    mode = "iptables"

    def __init__(self, cfg: ProxyConfig) -> None:
        self.proxy = cfg
        self.configs = {f: IptablesConfig(family=f, proxy=cfg) for f in FAMILIES}
        self._families: list[_Family] | None = None
        self.metrics: IptablesMetrics | None = None
        self.last_restore: str = ""
        """The last restore input that succeeded (for debugging)."""

    def register_metrics(self, registry: CollectorRegistry) -> None:
        self.metrics = IptablesMetrics(registry)

    # ---- render ---------------------------------------------------------------------------

    def render(self, state: ProxyState) -> str:
        parts = []
        for family in FAMILIES:
            if family is IPFamily.IPV6 and not state.sorted_services(family):
                continue
            tool = "ip6tables-restore" if family is IPFamily.IPV6 else "iptables-restore"
            parts.append(
                f"# {family.value}: input for {tool} --noflush\n"
                + render(state, self.configs[family]).text()
            )
        return "".join(parts)

    # ---- sync -----------------------------------------------------------------------------

    def _setup(self) -> list[_Family]:
        if self._families is None:
            tables = open_tables(self.proxy.iptables_backend, FAMILIES, self.mode)
            self._families = [_Family(self.configs[f], ipt) for f, ipt in tables.items()]
            if self.configs[IPFamily.IPV4].localhost_enabled and IPFamily.IPV4 in tables:
                sysctl.ensure("net.ipv4.conf.all.route_localnet", "1")
        return self._families

    def _with_local_addresses(self, state: ProxyState) -> ProxyState:
        """NodePort CIDRs match this host's interface addresses (upstream's GetNodeIPs):
        the kernel supplies them to the state, so the render stays pure."""
        if not self.proxy.nodeport_addresses.cidrs:
            return state
        try:
            local = tuple(addresses.local_addresses())
        except Exception as err:  # netlink trouble must not stop the sync
            log.warning("cannot list local addresses: %s", err)
            return state
        return replace(state, node=state.node.with_local_addresses(local))

    def sync(self, request: SyncRequest) -> SyncResult:
        start = time.monotonic()
        fams = self._setup()
        state = self._with_local_addresses(request.state)
        render_s = apply_s = 0.0
        did_full = False
        no_local: dict[tuple[str, IPFamily], int] = {}
        for fam in fams:
            t0 = time.monotonic()
            new = render(state, fam.cfg)
            t1 = time.monotonic()
            full = self._sync_family(fam, new, request)
            apply_s += time.monotonic() - t1
            render_s += t1 - t0
            did_full = did_full or full
            for policy, n in new.no_local_endpoints().items():
                no_local[(policy, fam.family)] = n
            self._count(fam, new)
            filters = stale_filters(fam.last_state, state, fam.family)
            if filters:
                n = conntrack.delete(filters, ipv6=fam.family is IPFamily.IPV6)
                log.info("cleared %d stale UDP conntrack entries (%s)", n, fam.family.value)
            fam.last = new
            fam.last_state = state
        families = tuple(f.family for f in fams)
        if self.metrics is not None:
            self.metrics.durations.observe(did_full, time.monotonic() - start, families)
        return SyncResult(
            full=did_full,
            families=families,
            render_seconds=render_s,
            apply_seconds=apply_s,
            no_local_endpoints=no_local,
        )

    def _count(self, fam: _Family, new: Rendered) -> None:
        if self.metrics is None:
            return
        written = _written(self.last_restore)
        for table, n in new.rule_counts().items():
            self.metrics.rules_total.labels(table, fam.family.value).set(n)
            self.metrics.rules_last.labels(table, fam.family.value).set(written[table])

    def _sync_family(self, fam: _Family, new: Rendered, request: SyncRequest) -> bool:
        full = request.full or fam.last is None or not canary_present(fam.ipt)
        if not full:
            assert fam.last is not None
            text = partial_text(fam.last, new, request.changed)
            try:
                self._restore(fam, text, partial=True)
                return False
            except BackendError as err:
                log.warning("partial sync failed (%s); doing a full sync", err)
        ensure_canary(fam.ipt)
        try:
            existing = chains_in_save(fam.ipt.save("nat"))
        except IptablesError as err:
            log.error("iptables-save failed, stale chains stay until the next full sync: %s", err)
            existing = set()
        stale = {c for c in existing if names.is_service_chain(c)} - new.service_chains()
        self._restore(fam, new.text(delete_chains=stale))
        declared = {("filter", c) for c in new.filter_chain_names()} | {("nat", c) for c in NAT_TOP}
        ensure_jumps(fam.ipt, fam.cfg.jump_rules(), declared)
        return True

    def _restore(self, fam: _Family, text: str, partial: bool = False) -> None:
        try:
            fam.ipt.restore(text)
        except IptablesError as err:
            if self.metrics is not None:
                self.metrics.restore_failures.failed(fam.family, partial)
            where = f"\n{extract_lines(text, err.line)}" if err.line else ""
            log.error("%s restore failed: %s%s", fam.family.value, err, where)
            raise BackendError(f"{fam.family.value} iptables-restore failed: {err}") from None
        self.last_restore = text

    # ---- cleanup --------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Remove every chain and jump rule pyproxy's iptables mode creates, in both back ends;
        KUBE-FIREWALL and KUBE-MARK-MASQ only when nothing else (kubelet) still uses them."""
        cleanup_everywhere(
            JUMP_RULES + KUBELET_FIREWALL_JUMPS,
            {
                "filter": (*FILTER_TOP, KUBE_FIREWALL, KUBE_PROXY_CANARY),
                "nat": lambda c: (
                    c in NAT_TOP or c == KUBE_PROXY_CANARY or names.is_service_chain(c)
                ),
            },
            shared=(KUBE_FIREWALL, KUBE_MARK_MASQ),
            canary=True,
        )
