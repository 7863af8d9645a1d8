"""The IPVS backend: renders with ``render``, diffs with ``diff``, applies through
``pyproxy.kernel`` (pyroute2 for IPVS, ipsets and kube-ipvs0; iptables-restore for the few
rules). Every sync is incremental by nature: only the differences from the kernel's current
state are written, and nothing is flushed at start-up, so a restart keeps traffic flowing.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from pyproxy.backends.base import Backend, BackendError, BackendUnavailable, SyncRequest, SyncResult
from pyproxy.backends.ipvs.diff import CurrentDest, CurrentService, Plan, plan
from pyproxy.backends.ipvs.render import (
    DUMMY,
    FILTER_CHAINS,
    JUMPS,
    NAT_CHAINS,
    SCHEDULERS,
    Desired,
    IpvsConfig,
    family_sets,
    render,
    set_name,
)
from pyproxy.backends.stale_conntrack import stale_filters
from pyproxy.kernel import addresses, conntrack, sysctl
from pyproxy.kernel import ipvs as kipvs
from pyproxy.kernel.iptables import (
    Iptables,
    IptablesError,
    chains_in_save,
    detect_backend,
    remove_chains,
    working_tables,
)
from pyproxy.model.types import IPAddress, IPFamily, IPNetwork, ProxyState

log = logging.getLogger(__name__)

SYSCTLS = (
    ("net.ipv4.vs.conntrack", "1"),
    ("net.ipv4.ip_forward", "1"),
    ("net.ipv4.vs.expire_nodest_conn", "1"),
    ("net.ipv4.vs.expire_quiescent_template", "1"),
)
STRICT_ARP = (("net.ipv4.conf.all.arp_ignore", "1"), ("net.ipv4.conf.all.arp_announce", "2"))


@dataclass(frozen=True)
class IpvsOptions:
    ipvs_scheduler: str = "rr"
    masquerade_bit: int = 14
    masquerade_all: bool = False
    cluster_cidrs: tuple[IPNetwork, ...] = ()
    iptables_backend: str = "auto"
    ipvs_strict_arp: bool = False
    random_fully: bool = True
    nodeport_addresses: tuple[str, ...] = ()


def _jump_args(jump: tuple[str, str, str, tuple[str, ...], str]) -> list[str]:
    _, _, dst, extra, comment = jump
    return [*extra, "-m", "comment", "--comment", comment, "-j", dst]


class IpvsBackend(Backend):
    mode = "ipvs"

    def __init__(self, options: IpvsOptions | None = None) -> None:
        self.options = options or IpvsOptions()
        if self.options.ipvs_scheduler not in SCHEDULERS:
            raise BackendUnavailable(
                f"--ipvs-scheduler: {self.options.ipvs_scheduler!r} is not one of "
                f"{', '.join(SCHEDULERS)}"
            )
        self._ipt: dict[IPFamily, Iptables] | None = None
        self._last_state: ProxyState | None = None
        self._jumps_done = False
        self.last_plan: Plan | None = None
        self.restore_failures = 0

    def config(
        self, family: IPFamily = IPFamily.IPV4, node_ips: Iterable[IPAddress] = ()
    ) -> IpvsConfig:
        o = self.options
        return IpvsConfig(
            family=family,
            scheduler=o.ipvs_scheduler,
            masquerade_bit=o.masquerade_bit,
            masquerade_all=o.masquerade_all,
            cluster_cidrs=o.cluster_cidrs,
            node_ips=tuple(node_ips),
            random_fully=o.random_fully,
        )

    def render(self, state: ProxyState) -> str:
        parts = []
        for family in (IPFamily.IPV4, IPFamily.IPV6):
            if family is IPFamily.IPV6 and not state.sorted_services(family):
                continue
            d = render(state, self.config(family))
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

    # ---- set-up ---------------------------------------------------------------------------

    def _setup(self) -> dict[IPFamily, Iptables]:
        if self._ipt is not None:
            return self._ipt
        try:
            kipvs.Ipvs().close()
        except kipvs.IpvsError as err:
            raise BackendUnavailable(str(err)) from None
        if not kipvs.scheduler_available(self.options.ipvs_scheduler):
            raise BackendUnavailable(
                f"--ipvs-scheduler={self.options.ipvs_scheduler}: this kernel has no "
                f"ip_vs_{self.options.ipvs_scheduler} module"
            )
        for name, value in SYSCTLS + (STRICT_ARP if self.options.ipvs_strict_arp else ()):
            if not sysctl.ensure(name, value):
                log.error("ipvs mode needs sysctl %s=%s and could not set it", name, value)
        try:
            backend = detect_backend(self.options.iptables_backend)
        except IptablesError as err:
            raise BackendUnavailable(str(err)) from None
        kipvs.ensure_dummy(DUMMY)
        tables = {IPFamily.IPV4: Iptables(backend)}
        v6 = Iptables(backend, ipv6=True)
        if v6.available() and v6.run("-t", "nat", "-S", "POSTROUTING", check=False).returncode == 0:
            tables[IPFamily.IPV6] = v6
        else:
            log.warning("ip6tables (%s) does not work here; IPv6 services are not proxied", backend)
        self._ipt = tables
        log.info(
            "ipvs mode: scheduler %s, iptables %s back end, %s",
            self.options.ipvs_scheduler,
            backend,
            ", ".join(f.value for f in tables),
        )
        return tables

    def _node_ips(self, family: IPFamily, vips: set[str]) -> list[IPAddress]:
        """NodePort addresses: this host's addresses of ``family``, less loopback, link-local
        and kube-ipvs0's, narrowed by --nodeport-addresses CIDRs when given."""
        version = 4 if family is IPFamily.IPV4 else 6
        local: list[IPAddress] = [
            ip
            for ip in addresses.local_addresses()
            if ip.version == version
            and not ip.is_loopback
            and not ip.is_link_local
            and str(ip) not in vips
        ]
        specs = [s for s in self.options.nodeport_addresses if s not in ("all", "primary")]
        if not specs:
            return local
        nets = [ipaddress.ip_network(s, strict=False) for s in specs if s != "localhost"]
        return [ip for ip in local if any(ip in n for n in nets if n.version == version)]

    # ---- sync -------------------------------------------------------------------------------

    def sync(self, request: SyncRequest) -> SyncResult:
        tables = self._setup()
        t0 = time.monotonic()
        current_addrs = kipvs.dummy_addresses(DUMMY) or set()
        merged = Desired(ipsets={})
        per_family: dict[IPFamily, Desired] = {}
        node_ips: set[str] = set()
        for family in tables:
            ips = self._node_ips(family, current_addrs)
            node_ips |= {str(i) for i in ips}
            d = per_family[family] = render(request.state, self.config(family, ips))
            merged.services.update(d.services)
            merged.addresses |= d.addresses
            merged.ipsets.update(d.ipsets)
        types = {n: t for f in tables for n, t in family_sets(f).items()}
        t1 = time.monotonic()
        sets = kipvs.IpSets()
        ipvs = kipvs.Ipvs()
        try:
            for name, stype in types.items():  # the rules reference them: create them first
                sets.ensure(name, stype, kipvs.socket_family(name.startswith("KUBE-6-")))
            full = request.full or not self._jumps_done
            for family, ipt in tables.items():
                self._apply_iptables(ipt, per_family[family], full=full)
            self._jumps_done = True
            current = {
                key: CurrentService(
                    spec.scheduler,
                    spec.timeout,
                    {
                        d: CurrentDest(x.weight, x.active, x.inactive)
                        for d, x in ipvs.dests(key).items()
                    },
                )
                for key, spec in ipvs.services().items()
            }
            members = {name: sets.members(name, stype) for name, stype in types.items()}
            p = plan(merged, current, current_addrs, current_addrs | node_ips, members)
            for name, stype in types.items():
                for entry in sorted(p.ipset_add.get(name, ()), key=str):
                    sets.add(name, stype, entry)
                for entry in sorted(p.ipset_delete.get(name, ()), key=str):
                    sets.delete(name, stype, entry)
            kipvs.set_addresses(DUMMY, sorted(p.add_addresses), ())
            self._apply_plan(ipvs, p)
            kipvs.set_addresses(DUMMY, (), sorted(p.delete_addresses))
        except kipvs.IpvsError as err:
            raise BackendError(str(err)) from None
        finally:
            ipvs.close()
            sets.close()
        self.last_plan = p
        for family in tables:
            filters = stale_filters(self._last_state, request.state, family)
            if filters:
                n = conntrack.delete(filters, ipv6=family is IPFamily.IPV6)
                log.info("cleared %d stale UDP conntrack entries (%s)", n, family.value)
        self._last_state = request.state
        t2 = time.monotonic()
        fams = tuple(f.value for f in tables)
        return SyncResult(
            full=request.full,
            families=fams,
            rules_total={f"ipvs/{f.value}": len(per_family[f].services) for f in tables},
            rules_written={"ipvs/IPv4": len(p.add_services) + len(p.set_dests)},
            render_seconds=t1 - t0,
            apply_seconds=t2 - t1,
            no_local_endpoints={
                f"{k}/{f.value}": v for f in tables for k, v in per_family[f].no_local.items()
            },
            restore_failures={f: (self.restore_failures, 0) for f in fams},
        )

    def _apply_iptables(self, ipt: Iptables, desired: Desired, full: bool) -> None:
        try:
            ipt.restore(desired.iptables)  # declares every chain the jumps point to
        except IptablesError as err:
            self.restore_failures += 1
            raise BackendError(f"iptables-restore failed: {err}") from None
        if full:
            try:
                ipt.ensure_jumps((j[0], j[1], _jump_args(j)) for j in JUMPS)
            except IptablesError as err:
                raise BackendError(f"cannot install jump rules: {err}") from None

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
        vips = kipvs.dummy_addresses(DUMMY) or set()
        errors: list[str] = []
        try:
            sets = kipvs.IpSets()
            node_ports: set[int] = set()
            for family in (IPFamily.IPV4, IPFamily.IPV6):
                for proto in ("TCP", "UDP"):
                    name = set_name(f"KUBE-NODE-PORT-{proto}", family)
                    if name in sets.names():
                        node_ports |= {int(e[0]) for e in sets.members(name, "bitmap:port")}
            ipvs = kipvs.Ipvs()
            local = {str(ip) for ip in addresses.local_addresses()}
            for key in ipvs.services():
                if key[1] in vips or (key[1] in local and key[2] in node_ports):
                    ipvs.delete_service(key)
            ipvs.close()
        except (kipvs.IpvsError, OSError) as err:
            errors.append(str(err))
            sets = kipvs.IpSets()
        for ipt in working_tables():
            try:
                for jump in JUMPS:
                    ipt.delete_rule(jump[0], jump[1], _jump_args(jump))
                for table, chains in (("nat", NAT_CHAINS), ("filter", FILTER_CHAINS)):
                    present = chains_in_save(ipt.save(table))
                    remove_chains(
                        ipt, table, [c for c in chains if c in present], shared=("KUBE-MARK-MASQ",)
                    )
            except IptablesError as err:
                errors.append(f"{ipt.backend}: {err}")
        try:
            present = sets.names()
            for family in (IPFamily.IPV4, IPFamily.IPV6):
                for name in family_sets(family):
                    if name in present:
                        sets.destroy(name)
        finally:
            sets.close()
        kipvs.delete_link(DUMMY)
        if errors:
            raise BackendError("; ".join(errors))
