"""The IPVS backend: renders per service with ``table``, diffs with ``diff``, applies through
``pyproxy.kernel`` (pyroute2 for IPVS, ipsets and kube-ipvs0; iptables-restore for the few
rules). Nothing is flushed at start-up, so a restart keeps traffic flowing.

It runs on the shared engine (``backends/engine``), one ``IpvsFamily`` writer per IP family.
A full sync (at start, after an error, when the node's facts change, hourly) reads the
kernel's virtual servers, ipsets and addresses of its family and writes every difference.
Between full syncs each writer keeps its view of what it wrote: a partial sync renders the
changed services only, and reads from the kernel only the real servers of the virtual servers
it touches or that are draining, so its cost follows the change, not the cluster. A partial
write that fails is followed by a full one in the same sync.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import cast

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
from pyproxy.backends.engine.engine import DeleteConntrack, Engine
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
    iptables_text,
    set_name,
)
from pyproxy.backends.ipvs.table import IpvsCache, IpvsTable, Updates, render
from pyproxy.backends.ipvs.walk import IpvsWalk
from pyproxy.backends.metrics import FAMILY, RestoreFailures
from pyproxy.backends.sysctls import require_sysctls
from pyproxy.backends.trace import Packet, Trace
from pyproxy.backends.xtables.compare import compare as xtables_compare
from pyproxy.backends.xtables.rules import KUBE_MARK_MASQ
from pyproxy.backends.xtables.tables import cleanup_everywhere, ensure_jumps, open_tables
from pyproxy.config.settings import ProxyConfig
from pyproxy.kernel import conntrack
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
    """What a writer put into IPVS since its last full sync, trusted until an error."""

    services: dict[VSKey, kipvs.Service]
    """Virtual servers with the scheduler and persistence written."""
    draining: set[VSKey]
    """Virtual servers with real servers at weight 0 waiting for their connections to end."""


def _current_of(ipvs: kipvs.Ipvs, key: VSKey, spec: kipvs.Service) -> CurrentService:
    dests = {d: CurrentDest(x.weight, x.active, x.inactive) for d, x in ipvs.dests(key).items()}
    return CurrentService(spec.scheduler, spec.timeout, dests)


def _family_of(key: VSKey | str) -> IPFamily:
    return IPFamily.IPV6 if ":" in (key if isinstance(key, str) else key[1]) else IPFamily.IPV4


def _current(ipvs: kipvs.Ipvs, family: IPFamily) -> dict[VSKey, CurrentService]:
    """The kernel's virtual servers of ``family`` with their real servers."""
    return {key: _current_of(ipvs, key, spec) for key, spec in ipvs.services().items()
            if _family_of(key) is family}  # fmt: skip


class IpvsFamily:
    """One family's part of a sync (the engine's FamilyWriter): virtual servers, kube-ipvs0's
    addresses and ipset members of ``cfg.family``, and that family's few iptables rules."""

    def __init__(self, backend: IpvsBackend, cfg: IpvsConfig, ipt: Iptables) -> None:
        self.family = cfg.family
        self.cfg = cfg
        self.ipt = ipt
        self.cache = IpvsCache(cfg)
        self.types = family_sets(cfg.family)
        self.view: _View | None = None
        self._backend = backend

    def before_partial(self, programmed: IpvsTable, now: float) -> str:
        return "" if self.view is not None else "no view of IPVS yet"

    def deferred_until(self) -> float | None:
        return None

    def write_full(self, new: IpvsTable) -> None:
        """Read the kernel's objects of this family, write every difference, and start
        trusting the view."""
        self.view = None
        desired = new.desired()
        try:
            k = self._backend.kernel
            sets = k.ipsets()
            try:
                for name, stype in self.types.items():  # the rules reference them
                    sets.ensure(name, stype, kipvs.socket_family(self.family is IPFamily.IPV6))
                self._backend.restore(self, iptables_text(desired.iptables))
                addrs = {a for a in k.dummy_addresses(DUMMY) or ()
                         if _family_of(a) is self.family}  # fmt: skip
                ours = addrs | {str(ip) for ip in new.node.local_addresses}
                ipvs = k.ipvs()
                try:
                    members = {n: sets.members(n, t) for n, t in self.types.items()}
                    p = plan(desired, _current(ipvs, self.family), addrs, ours, members)
                    self._backend.write(ipvs, sets, self.types, p)
                finally:
                    ipvs.close()
            finally:
                sets.close()
        except kipvs.IpvsError as err:
            raise BackendError(str(err)) from None
        self.view = _View(
            {k: kipvs.Service(vs.scheduler, vs.timeout) for k, vs in desired.services.items()},
            {key for key, _ in p.draining},
        )

    def write_partial(self, programmed: IpvsTable, updates: Updates) -> Callable[[], None]:
        """Write what the updates change, against the view kept since the last full sync;
        read from the kernel only the changed and the draining virtual servers' real servers
        (their connection counts decide when a draining one goes)."""
        view = self.view
        assert view is not None
        delta = programmed.delta(updates)
        keys = delta.services | view.draining
        if not keys and delta.empty():
            return lambda: None
        wanted = {k: programmed.virtual_server_after(k, updates) for k in keys - delta.services}
        wanted.update(delta.wanted)
        try:
            k = self._backend.kernel
            sets, ipvs = k.ipsets(), k.ipvs()
            try:
                current = {
                    k: _current_of(ipvs, k, view.services[k]) for k in keys if k in view.services
                }
                p = plan_partial(wanted, current, delta)
                self._backend.write(ipvs, sets, self.types, p)
            finally:
                ipvs.close()
                sets.close()
        except kipvs.IpvsError as err:
            self.view = None  # the kernel is not what was written: read it again
            raise BackendError(str(err)) from None

        def record() -> None:
            for key, sched, timeout in (*p.add_services, *p.update_services):
                view.services[key] = kipvs.Service(sched, timeout)
            for key in p.delete_services:
                view.services.pop(key, None)
            view.draining = {key for key, _ in p.draining}

        return record


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

    def __init__(
        self,
        cfg: ProxyConfig,
        tables: Mapping[IPFamily, Iptables] | None = None,
        delete_conntrack: DeleteConntrack = conntrack.delete,
        kernel: kipvs.IpvsKernel | None = None,
        sysctls: Callable[..., None] = require_sysctls,
    ) -> None:
        """``tables``, ``delete_conntrack``, ``kernel`` and ``sysctls`` are kernel ports
        (default: the iptables back end chosen by the configuration, the conntrack tool,
        IPVS, ipset and address netlink, and /proc/sys of this network namespace)."""
        self.kernel = kernel or kipvs.IpvsKernel()
        self._sysctls = sysctls
        self.proxy = cfg
        self.configs = {f: IpvsConfig(family=f, proxy=cfg) for f in FAMILIES}
        scheduler = self.configs[IPFamily.IPV4].scheduler
        if scheduler not in SCHEDULERS:
            raise BackendUnavailable(
                f"--ipvs-scheduler: {scheduler!r} is not one of {', '.join(SCHEDULERS)}"
            )
        self._tables = tables
        self._delete_conntrack = delete_conntrack
        self._ipt: Mapping[IPFamily, Iptables] | None = None
        self._engine: Engine[IpvsTable] | None = None
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
                + iptables_text(d.iptables)
            )
        return "\n".join(parts)

    def service_traffic(self) -> dict[str, ServiceTraffic]:
        """Each virtual server's statistics (netlink), summed per service port over its
        addresses (cluster IP, NodePorts, external and load-balancer IPs): connections, and
        packets and bytes in both directions."""
        try:
            stats = self.kernel.statistics()
        except kipvs.IpvsError as err:
            raise BackendError(str(err)) from None
        tables = {f: t for f in FAMILIES if (t := self.programmed(f)) is not None}
        try:
            owned = [(tables[f].virtual_server(key) if f in tables else None, vs)
                     for key, (vs, _) in stats.items() for f in (_family_of(key),)]  # fmt: skip
        except (KeyError, RuntimeError):  # a sync changed the tables meanwhile
            raise BackendError("the IPVS tables changed while read; try again") from None
        return by_service_port(
            (desired.service_port,
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

    def compare(self, state: ProxyState) -> list[Difference]:
        """The full sync's reading of the kernel, without its writing: the plan it would
        carry out is the difference (and the iptables part, compared as iptables mode's)."""
        ipt = open_tables(self.proxy.iptables_backend, FAMILIES, self.mode, writes=False)
        local = tuple(self.kernel.local_addresses(exclude_links=(DUMMY,)))
        state = replace(state, node=state.node.with_local_addresses(local))
        tables = {f: IpvsCache(self.configs[f]).render(state) for f in ipt}
        per_family = {f: t.desired() for f, t in tables.items()}
        merged = _merged(per_family.values())
        types = {n: t for f in FAMILIES for n, t in family_sets(f).items()}
        ipsets = [kipvs.ipset_create_argv(n, t, n.startswith("KUBE-6-")) for n, t in types.items()]
        out: list[Difference] = []
        for family, d in per_family.items():
            text = iptables_text(d.iptables)
            out += xtables_compare(ipt[family], text, JUMPS, canary=False, prepare=ipsets)
        sets, ipvs = self.kernel.ipsets(), self.kernel.ipvs()
        try:
            members = {name: sets.members(name, stype) for name, stype in types.items()}
            current_addrs = self.kernel.dummy_addresses(DUMMY) or set()
            current = {k: v for f in FAMILIES for k, v in _current(ipvs, f).items()}
            p = plan(merged, current, current_addrs,
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

    # ---- set-up ---------------------------------------------------------------------------

    def prepare(self) -> None:
        self._engine_set_up()

    def _setup(self) -> Mapping[IPFamily, Iptables]:
        if self._ipt is not None:
            return self._ipt
        try:
            self.kernel.ipvs().close()
        except kipvs.IpvsError as err:
            raise BackendUnavailable(str(err)) from None
        scheduler = self.configs[IPFamily.IPV4].scheduler
        if not self.kernel.scheduler_available(scheduler):
            raise BackendUnavailable(
                f"--ipvs-scheduler={scheduler}: this kernel has no ip_vs_{scheduler} module"
            )
        strict = self.configs[IPFamily.IPV4].strict_arp
        self._sysctls(SYSCTLS + (STRICT_ARP if strict else ()), "ipvs mode")
        tables = self._tables or open_tables(self.proxy.iptables_backend, FAMILIES, self.mode)
        self.kernel.ensure_dummy(DUMMY)
        log.info("ipvs mode: scheduler %s", scheduler)
        self._ipt = tables
        return tables

    # ---- sync -------------------------------------------------------------------------------

    def writers(self) -> list[IpvsFamily]:
        """Each family's part of a sync (sets up the kernel on first use)."""
        return [cast(IpvsFamily, f.writer) for f in self._engine_set_up().families]

    def _engine_set_up(self) -> Engine[IpvsTable]:
        if self._engine is None:
            ipt = self._setup()
            writers = [IpvsFamily(self, self.configs[f], t) for f, t in ipt.items()]
            self._engine = Engine(writers, self._delete_conntrack)
        return self._engine

    def programmed(self, family: IPFamily) -> IpvsTable | None:
        """The virtual servers pyproxy last wrote (or tried to) for ``family``."""
        return self._engine.programmed(family) if self._engine else None

    def sync(self, request: SyncRequest) -> SyncResult:
        engine = self._engine_set_up()
        local = tuple(self.kernel.local_addresses(exclude_links=(DUMMY,)))
        state = replace(request.state, node=request.state.node.with_local_addresses(local))
        result = engine.sync(state, request)
        if self.metrics is not None:
            for fam in engine.families:
                if fam.programmed is not None:
                    family = fam.writer.family.value
                    self.metrics.virtual_servers.labels(family).set(len(fam.programmed.owners))
                    self.metrics.real_servers.labels(family).set(fam.programmed.real_servers)
        return result

    def restore(self, fam: IpvsFamily, text: str) -> None:
        """The family's few iptables rules (they declare every chain the jumps point to),
        then the jumps."""
        try:
            with self.transactions.applying(fam.ipt.restore_label, text):
                fam.ipt.restore(text)
        except IptablesError as err:
            if self.metrics is not None:
                self.metrics.restore_failures.failed(fam.family)
            raise BackendError(f"iptables-restore failed: {err}") from None
        declared = {("nat", c) for c in NAT_CHAINS} | {("filter", c) for c in FILTER_CHAINS}
        ensure_jumps(fam.ipt, JUMPS, declared)

    def write(
        self, ipvs: kipvs.Ipvs, sets: kipvs.IpSets, types: Mapping[str, str], p: Plan
    ) -> None:
        """ipset members, then kube-ipvs0's new addresses, virtual and real servers, and the
        addresses no longer wanted; recorded for /debug/rules as one transaction."""
        with self.transactions.applying("IPVS netlink", p.describe()):
            for name, stype in types.items():
                for entry in sorted(p.ipset_add.get(name, ()), key=str):
                    sets.add(name, stype, entry)
                for entry in sorted(p.ipset_delete.get(name, ()), key=str):
                    sets.delete(name, stype, entry)
            self.kernel.set_addresses(DUMMY, sorted(p.add_addresses), ())
            _apply_plan(ipvs, p)
            self.kernel.set_addresses(DUMMY, (), sorted(p.delete_addresses))

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
        sets = self.kernel.ipsets()
        try:
            present = sets.names()
            for family in FAMILIES:
                for name in family_sets(family):
                    if name in present:
                        sets.destroy(name)
        finally:
            sets.close()
        self.kernel.delete_link(DUMMY)
        if errors:
            raise BackendError("; ".join(errors))

    def _cleanup_ipvs(self) -> None:
        """Virtual servers on kube-ipvs0's addresses, or on a node address and a NodePort."""
        vips = self.kernel.dummy_addresses(DUMMY) or set()
        sets = self.kernel.ipsets()
        try:
            node_ports: set[int] = set()
            for family in FAMILIES:
                for proto in ("TCP", "UDP"):
                    name = set_name(f"KUBE-NODE-PORT-{proto}", family)
                    if name in sets.names():
                        node_ports |= {int(e[0]) for e in sets.members(name, "bitmap:port")}
        finally:
            sets.close()
        ipvs = self.kernel.ipvs()
        try:
            local = {str(ip) for ip in self.kernel.local_addresses()}
            for key in ipvs.services():
                if key[1] in vips or (key[1] in local and key[2] in node_ports):
                    ipvs.delete_service(key)
        finally:
            ipvs.close()


def _apply_plan(ipvs: kipvs.Ipvs, p: Plan) -> None:
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
