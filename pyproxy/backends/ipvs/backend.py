"""The IPVS backend: renders per service with ``table``, diffs with ``diff``, applies through
``pyproxy.kernel`` (pyroute2 for IPVS, ipsets and kube-ipvs0; iptables-restore for the few
rules). Nothing is flushed at start-up, so a restart keeps traffic flowing.

A full sync (at start, after an error, when the node's facts change, hourly) reads the
kernel's virtual servers, ipsets and addresses and writes every difference. Between full
syncs pyproxy keeps its view of what it wrote: a partial sync renders the changed services
only, and reads from the kernel only the real servers of the virtual servers it touches or
that are draining, so its cost follows the change, not the cluster. Any error drops the view
and the next sync reads the kernel again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

from prometheus_client import CollectorRegistry, Gauge

from pyproxy.backends.base import (
    Backend,
    BackendError,
    BackendUnavailable,
    Difference,
    ServiceTraffic,
    SyncRequest,
    SyncResult,
    by_service_port,
)
from pyproxy.backends.ipvs.diff import CurrentDest, CurrentService, Plan, plan, plan_partial
from pyproxy.backends.ipvs.mode import SCHEDULERS
from pyproxy.backends.ipvs.render import (
    DUMMY,
    FILTER_CHAINS,
    JUMPS,
    NAT_CHAINS,
    Desired,
    IpvsConfig,
    VSKey,
    family_sets,
    set_name,
)
from pyproxy.backends.ipvs.table import Delta, Table, render
from pyproxy.backends.ipvs.walk import IpvsWalk
from pyproxy.backends.metrics import FAMILY, RestoreFailures
from pyproxy.backends.stale_conntrack import stale_filters
from pyproxy.backends.sysctls import require_sysctls
from pyproxy.backends.trace import Packet, Trace
from pyproxy.backends.xtables.compare import compare as xtables_compare
from pyproxy.backends.xtables.rules import KUBE_MARK_MASQ
from pyproxy.backends.xtables.tables import cleanup_everywhere, ensure_jumps, open_tables
from pyproxy.config.settings import ProxyConfig
from pyproxy.kernel import addresses, conntrack
from pyproxy.kernel import ipvs as kipvs
from pyproxy.kernel.iptables import Iptables, IptablesError
from pyproxy.model.types import IPFamily, ProxyState

log = logging.getLogger(__name__)

FAMILIES = (IPFamily.IPV4, IPFamily.IPV6)
SYSCTLS = (
    ("net.ipv4.vs.conntrack", "1"),
    ("net.ipv4.ip_forward", "1"),
    ("net.ipv4.vs.expire_nodest_conn", "1"),
    ("net.ipv4.vs.expire_quiescent_template", "1"),
)
STRICT_ARP = (("net.ipv4.conf.all.arp_ignore", "1"), ("net.ipv4.conf.all.arp_announce", "2"))


class IpvsMetrics:
    """Upstream registers restore failures in IPVS mode; pyproxy adds what IPVS programs."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.restore_failures = RestoreFailures(registry)
        self.virtual_servers = Gauge(
            "pyproxy_ipvs_virtual_servers",
            "IPVS virtual servers programmed by pyproxy",
            FAMILY,
            registry=registry,
        )
        self.real_servers = Gauge(
            "pyproxy_ipvs_real_servers",
            "IPVS real servers (with a weight) programmed by pyproxy",
            FAMILY,
            registry=registry,
        )


@dataclass
class _View:
    """What pyproxy wrote into IPVS since the last full sync, trusted until an error."""

    services: dict[VSKey, kipvs.Service]
    """Virtual servers with the scheduler and persistence written."""
    draining: set[VSKey]
    """Virtual servers with real servers at weight 0 waiting for their connections to end."""


def _current_of(ipvs: kipvs.Ipvs, key: VSKey, spec: kipvs.Service) -> CurrentService:
    dests = {d: CurrentDest(x.weight, x.active, x.inactive) for d, x in ipvs.dests(key).items()}
    return CurrentService(spec.scheduler, spec.timeout, dests)


def _family_of(key: VSKey) -> IPFamily:
    return IPFamily.IPV6 if ":" in key[1] else IPFamily.IPV4


def _merged(per_family: Iterable[Desired]) -> Desired:
    """One desired state for both families (virtual servers, addresses and ipsets are keyed by
    address, so they never collide)."""
    merged = Desired(ipsets={})
    for d in per_family:
        merged.services.update(d.services)
        merged.addresses |= d.addresses
        merged.ipsets.update(d.ipsets)
    return merged


class IpvsBackend(Backend):
    mode = "ipvs"

    def __init__(self, cfg: ProxyConfig) -> None:
        self.proxy = cfg
        self.configs = {f: IpvsConfig(family=f, proxy=cfg) for f in FAMILIES}
        scheduler = self.configs[IPFamily.IPV4].scheduler
        if scheduler not in SCHEDULERS:
            raise BackendUnavailable(
                f"--ipvs-scheduler: {scheduler!r} is not one of {', '.join(SCHEDULERS)}"
            )
        self._ipt: dict[IPFamily, Iptables] | None = None
        self._last_state: ProxyState | None = None
        self._tables: dict[IPFamily, Table] | None = None
        self._view: _View | None = None
        self._jumps_done = False
        self.metrics: IpvsMetrics | None = None

    def register_metrics(self, registry: CollectorRegistry) -> None:
        self.metrics = IpvsMetrics(registry)

    def render(self, state: ProxyState) -> str:
        parts = []
        for family in FAMILIES:
            if family is IPFamily.IPV6 and not state.sorted_services(family):
                continue
            d = render(state, self.configs[family])
            types = family_sets(family)
            sets = "\n".join(
                f"# ipset {n} ({types[n]}): {len(v)} entries"
                for n, v in sorted(d.ipsets.items())
                if v
            )
            tool = "ip6tables" if family is IPFamily.IPV6 else "iptables"
            parts.append(
                f"# {family.value}\n"
                + d.listing()
                + f"\n# {DUMMY} addresses: {' '.join(sorted(d.addresses))}\n"
                + sets
                + f"\n\n# {tool}-restore input (--noflush)\n"
                + d.iptables
            )
        return "\n".join(parts)

    def service_traffic(self) -> dict[str, ServiceTraffic]:
        """Each virtual server's statistics (netlink), summed per service port over its
        addresses (cluster IP, NodePorts, external and load-balancer IPs): connections, and
        packets and bytes in both directions."""
        try:
            stats = kipvs.statistics()
        except kipvs.IpvsError as err:
            raise BackendError(str(err)) from None
        tables = self._tables or {}
        try:
            owned = [(tables[f].virtual_server(key) if f in tables else None, vs)
                     for key, (vs, _) in stats.items() for f in (_family_of(key),)]  # fmt: skip
        except (KeyError, RuntimeError):  # a sync changed the tables meanwhile
            raise BackendError("the IPVS tables changed while read; try again") from None
        return by_service_port(
            (desired.comment.split(" ", 1)[0],  # the comment starts with the service port
             ServiceTraffic(vs.connections, vs.packets_in + vs.packets_out,
                            vs.bytes_in + vs.bytes_out))
            for desired, vs in owned if desired is not None
        )  # fmt: skip

    def trace(self, state: ProxyState, packet: Packet) -> Trace:
        """The node's own addresses exclude kube-ipvs0's (service addresses), as a sync's do."""
        cfg = self.configs[packet.family]

        def make() -> IpvsWalk:
            services = state.service_addresses()
            local = tuple(a for a in state.node.local_addresses if a not in services)
            own = replace(state, node=state.node.with_local_addresses(local))
            return IpvsWalk(render(own, cfg), JUMPS, local, cfg.mark, family_sets(cfg.family))

        walk = self.walker(state, packet.family, make)
        return Trace(packet, self.mode, tuple(walk.walk(packet)))

    # ---- set-up ---------------------------------------------------------------------------

    def prepare(self) -> None:
        self._setup()

    def _setup(self) -> dict[IPFamily, Iptables]:
        if self._ipt is not None:
            return self._ipt
        try:
            kipvs.Ipvs().close()
        except kipvs.IpvsError as err:
            raise BackendUnavailable(str(err)) from None
        scheduler = self.configs[IPFamily.IPV4].scheduler
        if not kipvs.scheduler_available(scheduler):
            raise BackendUnavailable(
                f"--ipvs-scheduler={scheduler}: this kernel has no ip_vs_{scheduler} module"
            )
        strict = self.configs[IPFamily.IPV4].strict_arp
        require_sysctls(SYSCTLS + (STRICT_ARP if strict else ()), "ipvs mode")
        tables = open_tables(self.proxy.iptables_backend, FAMILIES, self.mode)
        kipvs.ensure_dummy(DUMMY)
        log.info("ipvs mode: scheduler %s", scheduler)
        self._ipt = tables
        return tables

    # ---- sync -------------------------------------------------------------------------------

    def sync(self, request: SyncRequest) -> SyncResult:
        ipt = self._setup()
        t0 = time.monotonic()
        local = tuple(addresses.local_addresses(exclude_links=(DUMMY,)))
        state = replace(request.state, node=request.state.node.with_local_addresses(local))
        tables = self._tables
        full = (
            request.full
            or self._view is None
            or tables is None
            or not all(t.fits(state) for t in tables.values())
        )
        try:
            if full or tables is None:
                tables = {f: Table.build(state, self.configs[f]) for f in ipt}
                self._tables, self._view = tables, None
                t1 = time.monotonic()
                self._full(ipt, tables, {str(ip) for ip in local})
            else:
                deltas = [t.update(state, request.changed) for t in tables.values()]
                t1 = time.monotonic()
                self._partial(tables, deltas)
        except kipvs.IpvsError as err:
            self._view = None  # the kernel is not what was written: read it again
            raise BackendError(str(err)) from None
        for family in tables:
            changed = None if full else request.changed
            filters = stale_filters(self._last_state, request.state, family, changed)
            if filters:
                n = conntrack.delete(filters, ipv6=family is IPFamily.IPV6)
                log.info("cleared %d stale UDP conntrack entries (%s)", n, family.value)
        self._last_state = request.state
        if self.metrics is not None:
            for family, t in tables.items():
                self.metrics.virtual_servers.labels(family.value).set(len(t.owners))
                self.metrics.real_servers.labels(family.value).set(t.real_servers)
        return SyncResult(
            full=full,
            families=tuple(tables),
            render_seconds=t1 - t0,
            apply_seconds=time.monotonic() - t1,
            no_local_endpoints={
                (k, f): v for f, t in tables.items() for k, v in t.no_local.items()
            },
        )

    def _full(
        self, ipt: dict[IPFamily, Iptables], tables: dict[IPFamily, Table], node_ips: set[str]
    ) -> None:
        """Read the kernel, write every difference, and start trusting the view."""
        per_family = {f: t.desired() for f, t in tables.items()}
        merged = _merged(per_family.values())
        types = self._set_types()
        sets = kipvs.IpSets()
        try:
            for name, stype in types.items():  # the rules reference them: create them first
                sets.ensure(name, stype, kipvs.socket_family(name.startswith("KUBE-6-")))
            for family, table in ipt.items():
                self._apply_iptables(family, table, per_family[family].iptables, full=True)
            self._jumps_done = True
            current_addrs = kipvs.dummy_addresses(DUMMY) or set()
            ipvs = kipvs.Ipvs()
            try:
                members = {name: sets.members(name, stype) for name, stype in types.items()}
                current = self._current(ipvs)
                p = plan(merged, current, current_addrs, current_addrs | node_ips, members)
                self._write(ipvs, sets, types, p)
            finally:
                ipvs.close()
        finally:
            sets.close()
        self._view = _View(
            {k: kipvs.Service(vs.scheduler, vs.timeout) for k, vs in merged.services.items()},
            {key for key, _ in p.draining},
        )

    def compare(self, state: ProxyState) -> list[Difference]:
        """The full sync's reading of the kernel, without its writing: the plan it would
        carry out is the difference (and the iptables part, compared as iptables mode's)."""
        ipt = open_tables(self.proxy.iptables_backend, FAMILIES, self.mode, writes=False)
        local = tuple(addresses.local_addresses(exclude_links=(DUMMY,)))
        state = replace(state, node=state.node.with_local_addresses(local))
        tables = {f: Table.build(state, self.configs[f]) for f in ipt}
        per_family = {f: t.desired() for f, t in tables.items()}
        merged = _merged(per_family.values())
        types = self._set_types()
        ipsets = [kipvs.ipset_create_argv(n, t, n.startswith("KUBE-6-")) for n, t in types.items()]
        out: list[Difference] = []
        for family, d in per_family.items():
            out += xtables_compare(ipt[family], d.iptables, JUMPS, canary=False, prepare=ipsets)
        sets, ipvs = kipvs.IpSets(), kipvs.Ipvs()
        try:
            members = {name: sets.members(name, stype) for name, stype in types.items()}
            current_addrs = kipvs.dummy_addresses(DUMMY) or set()
            p = plan(merged, self._current(ipvs), current_addrs,
                     current_addrs | {str(ip) for ip in local}, members)  # fmt: skip
        except kipvs.IpvsError as err:
            raise BackendError(str(err)) from None
        finally:
            ipvs.close()
            sets.close()

        def owner(key: kipvs.VSKey) -> str:
            names = [n for t in tables.values() for n in t.owners.get(key, ())]
            return str(max(names)) if names else ""

        return out + p.differences(owner)

    def _partial(self, tables: dict[IPFamily, Table], deltas: list[Delta]) -> None:
        """Write what the tables say changed, against the view kept since the last full sync;
        read from the kernel only the changed and the draining virtual servers' real servers
        (their connection counts decide when a draining one goes)."""
        view = self._view
        assert view is not None
        delta = Delta()
        for d in deltas:
            delta.services |= d.services
            delta.add_addresses |= d.add_addresses
            delta.delete_addresses |= d.delete_addresses
            for name, entries in d.ipset_add.items():
                delta.ipset_add.setdefault(name, set()).update(entries)
            for name, entries in d.ipset_delete.items():
                delta.ipset_delete.setdefault(name, set()).update(entries)
        keys = delta.services | view.draining
        if not keys and delta.empty():
            return
        wanted = {k: tables[_family_of(k)].virtual_server(k) for k in keys}
        types = self._set_types()
        sets = kipvs.IpSets()
        ipvs = kipvs.Ipvs()
        try:
            current = {
                k: _current_of(ipvs, k, view.services[k]) for k in keys if k in view.services
            }
            p = plan_partial(wanted, current, delta)
            self._write(ipvs, sets, types, p)
        finally:
            ipvs.close()
            sets.close()
        for key, sched, timeout in (*p.add_services, *p.update_services):
            view.services[key] = kipvs.Service(sched, timeout)
        for key in p.delete_services:
            view.services.pop(key, None)
        view.draining = {key for key, _ in p.draining}

    @staticmethod
    def _set_types() -> dict[str, str]:
        return {n: t for f in FAMILIES for n, t in family_sets(f).items()}

    def _write(self, ipvs: kipvs.Ipvs, sets: kipvs.IpSets, types: dict[str, str], p: Plan) -> None:
        """ipset members, then kube-ipvs0's new addresses, virtual and real servers, and the
        addresses no longer wanted; recorded for /debug/rules as one transaction."""
        with self.transactions.applying("IPVS netlink", p.describe()):
            for name, stype in types.items():
                for entry in sorted(p.ipset_add.get(name, ()), key=str):
                    sets.add(name, stype, entry)
                for entry in sorted(p.ipset_delete.get(name, ()), key=str):
                    sets.delete(name, stype, entry)
            kipvs.set_addresses(DUMMY, sorted(p.add_addresses), ())
            self._apply_plan(ipvs, p)
            kipvs.set_addresses(DUMMY, (), sorted(p.delete_addresses))

    @staticmethod
    def _current(ipvs: kipvs.Ipvs) -> dict[kipvs.VSKey, CurrentService]:
        return {key: _current_of(ipvs, key, spec) for key, spec in ipvs.services().items()}

    def _apply_iptables(self, family: IPFamily, ipt: Iptables, text: str, full: bool) -> None:
        try:
            with self.transactions.applying(ipt.restore_label, text):
                ipt.restore(text)  # declares every chain the jumps point to
        except IptablesError as err:
            if self.metrics is not None:
                self.metrics.restore_failures.failed(family)
            raise BackendError(f"iptables-restore failed: {err}") from None
        if full or not self._jumps_done:
            declared = {("nat", c) for c in NAT_CHAINS} | {("filter", c) for c in FILTER_CHAINS}
            ensure_jumps(ipt, JUMPS, declared)

    def _apply_plan(self, ipvs: kipvs.Ipvs, p: Plan) -> None:
        for key, sched, timeout in p.add_services:
            ipvs.add_service(key, kipvs.Service(sched, timeout))
        for key, sched, timeout in p.update_services:
            ipvs.update_service(key, kipvs.Service(sched, timeout))
        for key, dest, weight, new in p.set_dests:
            ipvs.set_dest(key, dest, weight, new)
        for key, dest in p.delete_dests:
            ipvs.delete_dest(key, dest)
        for key in p.delete_services:
            ipvs.delete_service(key)
        if p.draining:
            log.info("%d real servers draining at weight 0", len(p.draining))

    # ---- cleanup ----------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Remove pyproxy's virtual servers, ipsets, rules and kube-ipvs0; nothing else."""
        errors: list[str] = []
        try:
            self._cleanup_ipvs()
        except (kipvs.IpvsError, OSError) as err:
            errors.append(str(err))
        try:
            cleanup_everywhere(
                JUMPS, {"nat": NAT_CHAINS, "filter": FILTER_CHAINS}, shared=(KUBE_MARK_MASQ,)
            )
        except BackendError as err:
            errors.append(str(err))
        sets = kipvs.IpSets()
        try:
            present = sets.names()
            for family in FAMILIES:
                for name in family_sets(family):
                    if name in present:
                        sets.destroy(name)
        finally:
            sets.close()
        kipvs.delete_link(DUMMY)
        if errors:
            raise BackendError("; ".join(errors))

    @staticmethod
    def _cleanup_ipvs() -> None:
        """Virtual servers on kube-ipvs0's addresses, or on a node address and a NodePort."""
        vips = kipvs.dummy_addresses(DUMMY) or set()
        sets = kipvs.IpSets()
        try:
            node_ports: set[int] = set()
            for family in FAMILIES:
                for proto in ("TCP", "UDP"):
                    name = set_name(f"KUBE-NODE-PORT-{proto}", family)
                    if name in sets.names():
                        node_ports |= {int(e[0]) for e in sets.members(name, "bitmap:port")}
        finally:
            sets.close()
        ipvs = kipvs.Ipvs()
        try:
            local = {str(ip) for ip in addresses.local_addresses()}
            for key in ipvs.services():
                if key[1] in vips or (key[1] in local and key[2] in node_ports):
                    ipvs.delete_service(key)
        finally:
            ipvs.close()
