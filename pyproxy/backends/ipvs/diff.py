"""The difference between the desired IPVS state and the kernel's, as a list of operations
(pure: tested without a kernel).

Graceful termination follows upstream (pkg/proxy/ipvs/graceful_termination.go): a real
server that is no longer wanted but still has connections is set to weight 0, so it gets no
new ones while its open ones finish, and is deleted by a later sync once its connection
counts reach zero. UDP real servers are deleted at once (``expire_nodest_conn`` drops their
flows). A real server that comes back while draining gets its weight back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pyproxy.backends.base import Difference
from pyproxy.backends.ipvs.render import Desired, DestKey, Entry, VirtualServer, VSKey
from pyproxy.backends.ipvs.table import Delta

UDP = 17


@dataclass(frozen=True)
class CurrentDest:
    weight: int
    active: int = 0
    inactive: int = 0


@dataclass(frozen=True)
class CurrentService:
    scheduler: str
    timeout: int
    dests: dict[DestKey, CurrentDest]


PROTOCOLS = {6: "-t", 17: "-u", 132: "--sctp-service"}


def _hostport(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def _vs(key: VSKey) -> str:
    return f"{PROTOCOLS.get(key[0], str(key[0]))} {_hostport(key[1], key[2])}"


def _dest(d: DestKey) -> str:
    return _hostport(d[0], d[1])


@dataclass
class Plan:
    add_services: list[tuple[VSKey, str, int]] = field(default_factory=list)
    update_services: list[tuple[VSKey, str, int]] = field(default_factory=list)
    delete_services: list[VSKey] = field(default_factory=list)
    set_dests: list[tuple[VSKey, DestKey, int, bool]] = field(default_factory=list)
    """(service, dest, weight, new)"""
    delete_dests: list[tuple[VSKey, DestKey]] = field(default_factory=list)
    draining: list[tuple[VSKey, DestKey]] = field(default_factory=list)
    """Real servers at weight 0, waiting for their connections to end."""
    add_addresses: set[str] = field(default_factory=set)
    delete_addresses: set[str] = field(default_factory=set)
    ipset_add: dict[str, set[Entry]] = field(default_factory=dict)
    ipset_delete: dict[str, set[Entry]] = field(default_factory=dict)

    def describe(self) -> str:
        """The plan as ipvsadm-like lines, for /debug/rules ("" when it changes nothing)."""
        out = [f"-A {_vs(k)} -s {sched} -p {t}" for k, sched, t in self.add_services]
        out += [f"-E {_vs(k)} -s {sched} -p {t}" for k, sched, t in self.update_services]
        out += [f"-a {_vs(k)} -r {_dest(d)} -w {w}" + (" (new)" if new else "")
                for k, d, w, new in self.set_dests]  # fmt: skip
        out += [f"-d {_vs(k)} -r {_dest(d)}" for k, d in self.delete_dests]
        out += [f"-D {_vs(k)}" for k in self.delete_services]
        out += [f"address add {a}" for a in sorted(self.add_addresses)]
        out += [f"address del {a}" for a in sorted(self.delete_addresses)]
        for name, entries in sorted(self.ipset_add.items()):
            out += [f"ipset add {name} {e}" for e in sorted(map(str, entries))]
        for name, entries in sorted(self.ipset_delete.items()):
            out += [f"ipset del {name} {e}" for e in sorted(map(str, entries))]
        return "".join(line + "\n" for line in out)

    def differences(self, owner: Callable[[VSKey], str]) -> list[Difference]:
        """The plan read as what differs (``pyproxy diff``): what it would add is missing,
        what it would delete is not expected; ``owner`` names a virtual server's service."""
        out = [
            Difference(
                owner(k), f"IPVS virtual server {_vs(k)} (missing)", (f"-A {_vs(k)} -s {s} -p {t}",)
            )
            for k, s, t in self.add_services
        ]
        out += [
            Difference(owner(k), f"IPVS virtual server {_vs(k)}", (f"-E {_vs(k)} -s {s} -p {t}",))
            for k, s, t in self.update_services
        ]
        out += [
            Difference(
                owner(k), f"IPVS virtual server {_vs(k)}", (f"-a {_vs(k)} -r {_dest(d)} -w {w}",)
            )
            for k, d, w, _ in self.set_dests
        ]
        out += [
            Difference(
                owner(k), f"IPVS virtual server {_vs(k)}", (), (f"-a {_vs(k)} -r {_dest(d)}",)
            )
            for k, d in self.delete_dests
        ]
        out += [
            Difference(
                owner(k), f"IPVS virtual server {_vs(k)} (not expected)", (), (f"-A {_vs(k)}",)
            )
            for k in self.delete_services
        ]
        if self.add_addresses or self.delete_addresses:
            out.append(
                Difference(
                    "",
                    "addresses of kube-ipvs0",
                    tuple(sorted(self.add_addresses)),
                    tuple(sorted(self.delete_addresses)),
                )
            )
        for name in sorted(self.ipset_add.keys() | self.ipset_delete.keys()):
            add, delete = self.ipset_add.get(name, set()), self.ipset_delete.get(name, set())
            if add or delete:
                out.append(
                    Difference(
                        "",
                        f"ipset {name}",
                        tuple(sorted(map(str, add))),
                        tuple(sorted(map(str, delete))),
                    )
                )
        return out

    def empty(self) -> bool:
        return not (
            self.add_services
            or self.update_services
            or self.delete_services
            or self.set_dests
            or self.delete_dests
            or self.add_addresses
            or self.delete_addresses
            or any(self.ipset_add.values())
            or any(self.ipset_delete.values())
        )


def plan(
    desired: Desired,
    current: dict[VSKey, CurrentService],
    addresses: set[str],
    ours: set[str],
    sets: dict[str, set[Entry]],
) -> Plan:
    """Everything against everything (a full sync). ``ours``: addresses whose virtual
    servers pyproxy owns (kube-ipvs0's and node IPs); others' are left alone."""
    p = Plan()
    for key, vs in desired.services.items():
        _plan_service(p, key, vs, current.get(key))
    for key in sorted(current):
        if key not in desired.services and key[1] in ours:
            p.delete_services.append(key)
    p.add_addresses = desired.addresses - addresses
    p.delete_addresses = addresses - desired.addresses
    for name in sorted(desired.ipsets.keys() | sets.keys()):
        want = desired.ipsets.get(name, set())
        present = sets.get(name, set())
        p.ipset_add[name] = want - present
        p.ipset_delete[name] = present - want
    return p


def plan_partial(
    wanted: Mapping[VSKey, VirtualServer | None],
    current: Mapping[VSKey, CurrentService],
    delta: Delta,
) -> Plan:
    """Only what a partial sync touches: the virtual servers in ``wanted`` (None: no longer
    wanted) against their ``current`` kernel state (absent: not in the kernel), and the
    addresses and ipset entries the table says came or went."""
    p = Plan()
    for key in sorted(wanted):
        vs, cur = wanted[key], current.get(key)
        if vs is not None:
            _plan_service(p, key, vs, cur)
        elif cur is not None:
            p.delete_services.append(key)
    p.add_addresses = set(delta.add_addresses)
    p.delete_addresses = set(delta.delete_addresses)
    p.ipset_add = {n: set(v) for n, v in delta.ipset_add.items() if v}
    p.ipset_delete = {n: set(v) for n, v in delta.ipset_delete.items() if v}
    return p


def _plan_service(p: Plan, key: VSKey, vs: VirtualServer, cur: CurrentService | None) -> None:
    if cur is None:
        p.add_services.append((key, vs.scheduler, vs.timeout))
        p.set_dests += [(key, d, w, True) for d, w in sorted(vs.dests.items())]
        return
    if (cur.scheduler, cur.timeout) != (vs.scheduler, vs.timeout):
        p.update_services.append((key, vs.scheduler, vs.timeout))
    for dest, weight in sorted(vs.dests.items()):
        have = cur.dests.get(dest)
        if have is None:
            p.set_dests.append((key, dest, weight, True))
        elif have.weight != weight:
            p.set_dests.append((key, dest, weight, False))
    for dest, have in sorted(cur.dests.items()):
        if dest in vs.dests:
            continue
        if key[0] == UDP or have.active + have.inactive == 0:
            p.delete_dests.append((key, dest))
        else:
            if have.weight != 0:
                p.set_dests.append((key, dest, 0, False))
            p.draining.append((key, dest))
