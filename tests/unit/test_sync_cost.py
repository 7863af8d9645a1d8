"""The cost of a sync follows what changed, not the cluster: counted, never timed.

A real tracker, syncer and iptables backend over 10,000 services, with the kernel layer
replaced by one that records the restore input it is given (these are unit tests of the
sync logic; the namespace tests prove the same rules in a kernel).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from ipaddress import ip_address
from typing import Any

from pyproxy.backends.iptables import names
from pyproxy.backends.iptables.backend import IptablesBackend
from pyproxy.backends.iptables.table import Renderer
from pyproxy.config.settings import ProxyConfig
from pyproxy.kernel.iptables import Iptables
from pyproxy.model.events import KINDS, Event, EventType
from pyproxy.model.types import Endpoint, IPFamily, NamespacedName, Protocol, ServicePortName
from pyproxy.sync.syncer import Syncer
from pyproxy.sync.tracker import ChangeTracker
from tests.helpers import no_conntrack, objects, slice_of

N = 10_000


class RecordingIptables(Iptables):
    """Takes restore input and answers listings as an empty kernel would."""

    def __init__(self) -> None:
        super().__init__("nft")
        object.__setattr__(self, "restores", [])

    def restore(self, data: str, counters: bool = True) -> None:
        self.restores.append(data)  # type: ignore[attr-defined]

    def save(self, table: str, timeout: float = 120, counters: bool = False) -> str:
        return ""

    def chain_exists(self, table: str, chain: str) -> bool:
        return True

    def ensure_rules_first(self, rules: Iterable[tuple[str, str, Sequence[str]]]) -> int:
        return 0


def world() -> tuple[ChangeTracker, Syncer, RecordingIptables, Renderer]:
    tracker = ChangeTracker("node-a")
    objs = objects(N)
    for kind in KINDS:
        tracker.apply(
            Event(kind, EventType.REPLACE, objects=[o for o in objs if o["kind"] == kind])
        )
        tracker.apply(Event(kind, EventType.SYNCED))
    ipt = RecordingIptables()
    sysctls: list[Any] = []  # the port: a unit test never writes this host's /proc/sys
    backend = IptablesBackend(ProxyConfig(), tables={IPFamily.IPV4: ipt},
                              sysctls=lambda *a, **k: sysctls.append(a),
                              delete_conntrack=no_conntrack)  # fmt: skip
    (family,) = backend.writers()
    return tracker, Syncer(tracker, backend), ipt, family.cache


def test_a_one_service_change_renders_and_writes_one_service() -> None:
    tracker, syncer, ipt, renderer = world()
    syncer.sync()
    assert renderer.renders == N  # the first sync is full
    first = "".join(ipt.restores)  # type: ignore[attr-defined]
    assert first.count("-A KUBE-SVC-") == N * 2  # two endpoints each
    ipt.restores.clear()  # type: ignore[attr-defined]

    tracker.apply(Event("EndpointSlice", EventType.MODIFIED, slice_of(77, ["10.200.0.1"])))
    syncer.sync()
    assert renderer.renders == N + 1  # only the changed service was rendered again
    (text,) = ipt.restores  # type: ignore[attr-defined]
    spn = ServicePortName(NamespacedName("bench", "svc-77"), "http", Protocol.TCP)
    old = {names.endpoint_chain(spn, Endpoint(ip_address(f"10.128.77.{k}"), 8080)) for k in (1, 2)}
    new = names.endpoint_chain(spn, Endpoint(ip_address("10.200.0.1"), 8080))
    chains = {line.split()[1] for line in text.splitlines() if line.startswith(("-A ", "-X "))}
    chains |= {line[1:].split()[0] for line in text.splitlines() if line.startswith(":")}
    assert chains == {names.cluster_chain(spn), new, *old}  # rewritten, added, deleted
    assert f"-A {names.cluster_chain(spn)} -j {new}" in text.splitlines()
    assert ":KUBE-SERVICES" not in text  # the top-level chain is not rewritten


def test_an_idle_resync_writes_nothing() -> None:
    _, syncer, ipt, renderer = world()
    syncer.sync()
    ipt.restores.clear()  # type: ignore[attr-defined]
    for _ in range(3):
        syncer.sync()
    assert ipt.restores == []  # type: ignore[attr-defined]
    assert renderer.renders == N
    assert syncer.stats.full_syncs == 1


def test_the_tracker_hands_out_snapshots_without_copying() -> None:
    tracker, _, _, _ = world()
    first = tracker.take()
    tracker.apply(Event("EndpointSlice", EventType.MODIFIED, slice_of(5, ["10.200.0.5"])))
    second = tracker.take()
    assert second.changed_services == {NamespacedName("bench", "svc-5")}
    # The earlier snapshot is unchanged, and the two share everything else.
    spn = next(iter(second.state.services))
    assert first.state.services[spn] is second.state.services[spn]
    name5 = next(s for s in first.state.endpoints if s.service.name == "svc-5")
    assert [str(e.ip) for e in first.state.endpoints[name5]] != ["10.200.0.5"]
    assert [str(e.ip) for e in second.state.endpoints[name5]] == ["10.200.0.5"]
