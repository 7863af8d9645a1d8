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
    SETS,
    Desired,
    IpvsConfig,
    render,
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
        self._ipt: Iptables | None = None
        self._last_state: ProxyState | None = None
        self._jumps_done = False
        self.last_plan: Plan | None = None
        self.restore_failures = 0

    def config(self, node_ips: Iterable[IPAddress] = ()) -> IpvsConfig:
        o = self.options
        return IpvsConfig(
            scheduler=o.ipvs_scheduler,
            masquerade_bit=o.masquerade_bit,
            masquerade_all=o.masquerade_all,
            cluster_cidrs=o.cluster_cidrs,
            node_ips=tuple(node_ips),
            random_fully=o.random_fully,
        )

    def render(self, state: ProxyState) -> str:
        d = render(state, self.config())
        sets = "\n".join(
            f"# ipset {n} ({SETS[n]}): {len(d.ipsets[n])} entries" for n in SETS if d.ipsets[n]
        )
        return (
            d.listing()
            + f"\n# {DUMMY} addresses: {' '.join(sorted(d.addresses))}\n"
            + sets
            + "\n\n# iptables-restore input (--noflush)\n"
            + d.iptables
        )

    # ---- set-up ---------------------------------------------------------------------------

    def _setup(self) -> Iptables:
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
        self._ipt = Iptables(backend)
        log.info(
            "ipvs mode: scheduler %s, iptables %s back end", self.options.ipvs_scheduler, backend
        )
        return self._ipt

    def _node_ips(self, vips: set[str]) -> list[IPAddress]:
        """NodePort addresses: this host's IPv4 addresses, less loopback and kube-ipvs0's."""
        local: list[IPAddress] = [
            ip
            for ip in addresses.local_addresses()
            if ip.version == 4 and not ip.is_loopback and str(ip) not in vips
        ]
        specs = [s for s in self.options.nodeport_addresses if s not in ("all", "primary")]
        if not specs:
            return local
        nets = [ipaddress.ip_network(s, strict=False) for s in specs if s != "localhost"]
        return [ip for ip in local if any(ip in n for n in nets if n.version == 4)]

    # ---- sync -------------------------------------------------------------------------------

    def sync(self, request: SyncRequest) -> SyncResult:
        ipt = self._setup()
        t0 = time.monotonic()
        current_addrs = kipvs.dummy_addresses(DUMMY) or set()
        node_ips = self._node_ips(current_addrs)
        desired = render(request.state, self.config(node_ips))
        t1 = time.monotonic()
        sets = kipvs.IpSets()
        ipvs = kipvs.Ipvs()
        try:
            for name, stype in SETS.items():  # the rules reference them: create them first
                sets.ensure(name, stype)
            self._apply_iptables(ipt, desired, full=request.full or not self._jumps_done)
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
            members = {name: sets.members(name, stype) for name, stype in SETS.items()}
            p = plan(
                desired, current, current_addrs, current_addrs | {str(i) for i in node_ips}, members
            )
            for name, stype in SETS.items():
                for entry in sorted(p.ipset_add[name], key=str):
                    sets.add(name, stype, entry)
                for entry in sorted(p.ipset_delete[name], key=str):
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
        filters = stale_filters(self._last_state, request.state, IPFamily.IPV4)
        if filters:
            n = conntrack.delete(filters)
            log.info("cleared %d stale UDP conntrack entries", n)
        self._last_state = request.state
        t2 = time.monotonic()
        return SyncResult(
            full=request.full,
            families=("IPv4",),
            rules_total={"ipvs/IPv4": len(desired.services)},
            rules_written={"ipvs/IPv4": len(p.add_services) + len(p.set_dests)},
            render_seconds=t1 - t0,
            apply_seconds=t2 - t1,
            no_local_endpoints={f"{k}/IPv4": v for k, v in desired.no_local.items()},
            restore_failures={"IPv4": (self.restore_failures, 0)},
        )

    def _apply_iptables(self, ipt: Iptables, desired: Desired, full: bool) -> None:
        if full:
            try:
                for table, _src, dst, _, _ in JUMPS:
                    ipt.ensure_chain(table, dst)
                for jump in JUMPS:
                    ipt.ensure_rule_first(jump[0], jump[1], _jump_args(jump))
            except IptablesError as err:
                raise BackendError(f"cannot install jump rules: {err}") from None
            self._jumps_done = True
        try:
            ipt.restore(desired.iptables)
        except IptablesError as err:
            self.restore_failures += 1
            raise BackendError(f"iptables-restore failed: {err}") from None

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
            for proto in ("TCP", "UDP"):
                name = f"KUBE-NODE-PORT-{proto}"
                if name in sets.names():
                    node_ports |= {int(e[0]) for e in sets.members(name, SETS[name])}
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
            if ipt.ipv6:
                continue
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
            for name in SETS:
                if name in sets.names():
                    sets.destroy(name)
        finally:
            sets.close()
        kipvs.delete_link(DUMMY)
        if errors:
            raise BackendError("; ".join(errors))
