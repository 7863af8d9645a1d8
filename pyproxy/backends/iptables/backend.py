"""The iptables backend: renders with ``render`` and applies through ``pyproxy.kernel``.

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
A full sync runs at start, after any failure, on node-label changes, when the canary chain
disappears (someone flushed the tables) and every sync period.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from pyproxy.backends.base import Backend, BackendError, BackendUnavailable, SyncRequest, SyncResult
from pyproxy.backends.iptables import names
from pyproxy.backends.iptables.render import (
    FILTER_TOP,
    KUBE_FIREWALL,
    KUBE_MARK_MASQ,
    KUBE_PROXY_CANARY,
    KUBE_SERVICES,
    NAT_TOP,
    IptablesConfig,
    Rendered,
    render,
)
from pyproxy.backends.stale_conntrack import stale_filters
from pyproxy.kernel import addresses, conntrack, sysctl
from pyproxy.kernel.iptables import (
    Iptables,
    IptablesError,
    chains_in_save,
    detect_backend,
    extract_lines,
    remove_chains,
    working_tables,
)
from pyproxy.model.types import IPAddress, IPFamily, IPNetwork, NamespacedName, ProxyState

log = logging.getLogger(__name__)

NODEPORT_KEYWORDS = ("all", "primary", "localhost")


@dataclass(frozen=True)
class IptablesOptions:
    masquerade_bit: int = 14
    masquerade_all: bool = False
    cluster_cidrs: tuple[IPNetwork, ...] = ()
    localhost_nodeports: bool = True
    nodeport_addresses: tuple[str, ...] = ()
    """CIDRs or the keywords all/primary/localhost; empty means all."""
    iptables_backend: str = "auto"
    families: tuple[IPFamily, ...] = (IPFamily.IPV4, IPFamily.IPV6)
    random_fully: bool = True
    conntrack_tcp_liberal: bool = False
    primary_ips: tuple[IPAddress, ...] = ()
    """The node's primary addresses (for the "primary" keyword and source-range checks)."""


@dataclass
class _Family:
    family: IPFamily
    ipt: Iptables
    last: Rendered | None = None
    last_state: ProxyState | None = None
    restore_failures: int = 0
    partial_failures: int = 0


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


class IptablesBackend(Backend):
    mode = "iptables"

    def __init__(self, options: IptablesOptions | None = None) -> None:
        self.options = options or IptablesOptions()
        self._families: list[_Family] | None = None
        self.last_restore: str = ""
        """The last restore input that succeeded (for debugging / ``explain``)."""

    # ---- configuration ------------------------------------------------------------------

    def config(
        self, family: IPFamily, local_ips: Iterable[IPAddress] | None = None
    ) -> IptablesConfig:
        opts = self.options
        nodeport_ips = None
        specs = opts.nodeport_addresses
        if specs and "all" not in specs:
            local = list(local_ips if local_ips is not None else ())
            chosen: list[IPAddress] = []
            for spec in specs:
                if spec == "primary":
                    chosen += [ip for ip in opts.primary_ips if ip in local or not local]
                elif spec == "localhost":
                    chosen += [ip for ip in local if ip.is_loopback]
                else:
                    net = _cidr(spec)
                    chosen += [ip for ip in local if ip.version == net.version and ip in net]
            nodeport_ips = tuple(dict.fromkeys(chosen))
        node_ips = tuple(opts.primary_ips) or tuple(
            ip for ip in (local_ips or ()) if not ip.is_loopback
        )
        return IptablesConfig(
            family=family,
            masquerade_bit=opts.masquerade_bit,
            masquerade_all=opts.masquerade_all,
            cluster_cidrs=opts.cluster_cidrs,
            localhost_nodeports=opts.localhost_nodeports,
            nodeport_ips=nodeport_ips,
            node_ips=node_ips,
            conntrack_tcp_liberal=opts.conntrack_tcp_liberal,
            random_fully=opts.random_fully,
        )

    def _needs_local_ips(self) -> bool:
        specs = self.options.nodeport_addresses
        return (bool(specs) and "all" not in specs) or not self.options.primary_ips

    def _local_ips(self) -> list[IPAddress] | None:
        if not self._needs_local_ips():
            return None
        try:
            return list(addresses.local_addresses())
        except Exception as err:  # netlink trouble must not stop the sync
            log.warning("cannot list local addresses: %s", err)
            return None

    # ---- render ---------------------------------------------------------------------------

    def render(self, state: ProxyState) -> str:
        local = self._local_ips() if self.options.nodeport_addresses else None
        parts = []
        for family in self.options.families:
            if family is IPFamily.IPV6 and not state.sorted_services(family):
                continue
            tool = "ip6tables-restore" if family is IPFamily.IPV6 else "iptables-restore"
            parts.append(
                f"# {family.value}: input for {tool} --noflush\n"
                + render(state, self.config(family, local)).text()
            )
        return "".join(parts)

    # ---- sync -----------------------------------------------------------------------------

    def _setup(self) -> list[_Family]:
        if self._families is not None:
            return self._families
        try:
            backend = detect_backend(self.options.iptables_backend)
        except IptablesError as err:
            raise BackendUnavailable(str(err)) from None
        fams: list[_Family] = []
        for family in self.options.families:
            ipt = Iptables(backend, ipv6=family is IPFamily.IPV6)
            if family is IPFamily.IPV6:
                res = None
                try:
                    res = ipt.run("-t", "nat", "-S", "POSTROUTING", check=False, timeout=20)
                except (OSError, IptablesError):
                    pass
                if res is None or res.returncode != 0:
                    log.warning(
                        "ip6tables (%s) does not work here; IPv6 services are not proxied", backend
                    )
                    continue
            fams.append(_Family(family, ipt))
        log.info(
            "iptables mode: using the %s back end for %s",
            backend,
            ", ".join(f.family.value for f in fams),
        )
        if self.options.localhost_nodeports and any(f.family is IPFamily.IPV4 for f in fams):
            sysctl.ensure("net.ipv4.conf.all.route_localnet", "1")
        self._families = fams
        return fams

    @property
    def iptables_backend(self) -> str:
        fams = self._setup()
        return fams[0].ipt.backend if fams else ""

    def sync(self, request: SyncRequest) -> SyncResult:
        fams = self._setup()
        total: Counter[str] = Counter()
        written: Counter[str] = Counter()
        no_local: Counter[str] = Counter()
        did_full = False
        render_s = apply_s = 0.0
        local = self._local_ips()
        for fam in fams:
            name = fam.family.value
            t0 = time.monotonic()
            cfg = self.config(fam.family, local)
            new = render(request.state, cfg)
            t1 = time.monotonic()
            full = self._sync_family(fam, new, request)
            apply_s += time.monotonic() - t1
            render_s += t1 - t0
            did_full = did_full or full
            total.update({f"{t}/{name}": n for t, n in new.rule_counts().items()})
            written.update({f"{t}/{name}": n for t, n in _written(self.last_restore).items()})
            no_local.update({f"{p}/{name}": n for p, n in new.no_local_endpoints().items()})
            filters = stale_filters(fam.last_state, request.state, fam.family)
            if filters:
                n = conntrack.delete(filters, ipv6=fam.family is IPFamily.IPV6)
                log.info("cleared %d stale UDP conntrack entries (%s)", n, name)
            fam.last = new
            fam.last_state = request.state
        return SyncResult(
            full=did_full,
            families=tuple(f.family.value for f in fams),
            rules_total=dict(total),
            rules_written=dict(written),
            render_seconds=render_s,
            apply_seconds=apply_s,
            no_local_endpoints=dict(no_local),
            restore_failures=self.failure_counts(),
        )

    def _sync_family(self, fam: _Family, new: Rendered, request: SyncRequest) -> bool:
        full = request.full or fam.last is None or not self._canary_ok(fam)
        if not full:
            assert fam.last is not None
            text = partial_text(fam.last, new, request.changed)
            try:
                self._restore(fam, text)
                return False
            except BackendError as err:
                fam.partial_failures += 1
                log.warning("partial sync failed (%s); doing a full sync", err)
        self._ensure_jumps(fam)
        try:
            existing = chains_in_save(fam.ipt.save("nat"))
        except IptablesError as err:
            log.error("iptables-save failed, stale chains stay until the next full sync: %s", err)
            existing = set()
        stale = {c for c in existing if names.is_service_chain(c)} - new.service_chains()
        self._restore(fam, new.text(delete_chains=stale))
        return True

    def _restore(self, fam: _Family, text: str) -> None:
        try:
            fam.ipt.restore(text)
        except IptablesError as err:
            fam.restore_failures += 1
            where = f"\n{extract_lines(text, err.line)}" if err.line else ""
            log.error("%s restore failed: %s%s", fam.family.value, err, where)
            raise BackendError(f"{fam.family.value} iptables-restore failed: {err}") from None
        self.last_restore = text

    def _canary_ok(self, fam: _Family) -> bool:
        try:
            return fam.ipt.chain_exists("mangle", KUBE_PROXY_CANARY)
        except (OSError, IptablesError):
            return False

    def _ensure_jumps(self, fam: _Family) -> None:
        cfg = IptablesConfig(
            family=fam.family, localhost_nodeports=self.options.localhost_nodeports
        )
        try:
            for table in ("mangle", "nat", "filter"):
                fam.ipt.ensure_chain(table, KUBE_PROXY_CANARY)
            for jump in cfg.jump_rules():
                fam.ipt.ensure_chain(jump.table, jump.dst)
                fam.ipt.ensure_rule_first(jump.table, jump.src, jump.args())
        except IptablesError as err:
            raise BackendError(f"cannot install jump rules: {err}") from None

    # ---- cleanup --------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Remove every chain and jump rule pyproxy's iptables mode creates, in both back ends."""
        errors = []
        for ipt in working_tables():
            try:
                cleanup_tables(ipt)
            except (OSError, IptablesError) as err:
                errors.append(f"{ipt.backend}/{ipt.family_name}: {err}")
        if errors:
            raise BackendError("; ".join(errors))

    def failure_counts(self) -> dict[str, tuple[int, int]]:
        """{family: (restore failures, partial restore failures)}, cumulative."""
        return {
            f.family.value: (f.restore_failures, f.partial_failures) for f in (self._families or [])
        }


def cleanup_tables(ipt: Iptables, extra_jumps: Iterable[tuple[str, str, list[str]]] = ()) -> None:
    """Delete pyproxy's jump rules, then flush and delete its chains, in one back end/family."""
    cfg = IptablesConfig(localhost_nodeports=not ipt.ipv6)
    jumps = [(j.table, j.src, j.args()) for j in cfg.jump_rules()] + list(extra_jumps)
    for table, src, args in jumps:
        ipt.delete_rule(table, src, args)
    for table, top in (("filter", (*FILTER_TOP, KUBE_FIREWALL)), ("nat", (*NAT_TOP,))):
        present = chains_in_save(ipt.save(table))
        ours = [
            c
            for c in present
            if c in top or c == KUBE_PROXY_CANARY or (table == "nat" and names.is_service_chain(c))
        ]
        remove_chains(ipt, table, ours, shared=(KUBE_FIREWALL, KUBE_MARK_MASQ))
    if ipt.chain_exists("mangle", KUBE_PROXY_CANARY):
        ipt.run("-t", "mangle", "-X", KUBE_PROXY_CANARY, check=False)


def _cidr(spec: str) -> IPNetwork:
    return ipaddress.ip_network(spec, strict=False)
