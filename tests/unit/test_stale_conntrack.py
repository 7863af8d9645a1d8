"""Which UDP conntrack entries a change makes stale: the ``conntrack -D`` filters, written out
by hand from upstream's reconciler (pkg/proxy/conntrack/cleanup.go: an entry to a service's
address and port, or to its NodePort, whose reply does not come from a serving endpoint's
address and port). The namespace-world test ``test_udp_client_follows_a_changed_target_port``
sends the packets."""

from __future__ import annotations

from pyproxy.backends.stale_conntrack import stale_filters
from pyproxy.model.types import IPFamily, ProxyState
from tests.helpers import endpoint, endpoint_slice, node, port, service, tracker_with

NODE = "node-a"
SVC = service("ns", "dns", "10.96.0.10", [port("dns", 53, "UDP", nodePort=30053)], type="NodePort")


def state(*eps: tuple[str, int]) -> ProxyState:
    slices = [
        endpoint_slice("ns", "dns", f"dns-{i}", [endpoint(ip, node=NODE)], [port("dns", p, "UDP")])
        for i, (ip, p) in enumerate(eps)
    ]
    return tracker_with(NODE, node(NODE, addresses=["172.18.0.2"]), SVC, *slices).current_state()


def test_a_target_port_that_moves_on_the_same_pod_makes_the_old_port_stale() -> None:
    old, new = state(("10.244.1.5", 8080)), state(("10.244.1.5", 9090))
    assert stale_filters(old, new, IPFamily.IPV4) == [
        ("-p", "udp", "--orig-dst", "10.96.0.10", "--dport", "53",
         "--reply-src", "10.244.1.5", "--reply-port-src", "8080"),
        ("-p", "udp", "--dport", "30053", "--reply-src", "10.244.1.5", "--reply-port-src", "8080"),
    ]  # fmt: skip


def test_an_endpoint_that_stays_makes_nothing_stale() -> None:
    old = state(("10.244.1.5", 8080))
    new = state(("10.244.1.5", 8080), ("10.244.2.7", 8080))
    assert stale_filters(old, new, IPFamily.IPV4) == []


def test_a_removed_endpoint_is_stale_on_the_port_it_served() -> None:
    old = state(("10.244.1.5", 8080), ("10.244.2.7", 8080))
    new = state(("10.244.2.7", 8080))
    assert stale_filters(old, new, IPFamily.IPV4) == [
        ("-p", "udp", "--orig-dst", "10.96.0.10", "--dport", "53",
         "--reply-src", "10.244.1.5", "--reply-port-src", "8080"),
        ("-p", "udp", "--dport", "30053", "--reply-src", "10.244.1.5", "--reply-port-src", "8080"),
    ]  # fmt: skip
