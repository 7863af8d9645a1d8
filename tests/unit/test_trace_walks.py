"""The trace walks on rendered rules (pure): the shares a statistic or numgen chain gives,
refusals, and a rule the walk cannot read is an error, never a silent "no match"."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pytest

from pyproxy.backends.iptables.backend import IptablesBackend
from pyproxy.backends.ipvs.backend import IpvsBackend
from pyproxy.backends.nftables.backend import NftablesBackend
from pyproxy.backends.nftables.rule import Rule as NftRule
from pyproxy.backends.nftables.rule import Verdict
from pyproxy.backends.nftables.walk import Table
from pyproxy.backends.nftables.walk import Walker as NftWalker
from pyproxy.backends.trace import Packet, TraceError
from pyproxy.backends.userspace.backend import UserspaceBackend
from pyproxy.backends.xtables.rule import Match, Module, Rule
from pyproxy.backends.xtables.walk import Walker as XtablesWalker
from pyproxy.config.settings import ProxyConfig
from tests.helpers import endpoint, endpoint_slice, port, service, tracker_with

BACKENDS = (IptablesBackend, NftablesBackend, IpvsBackend, UserspaceBackend)
CLIENT = ipaddress.ip_address("203.0.113.7")


def state(n: int) -> object:
    eps = [endpoint(f"10.1.0.{i + 1}", node="n1") for i in range(n)]
    objs = [service("ns", "web", "10.96.0.1", [port("http", 80)])]
    if n:
        objs.append(endpoint_slice("ns", "web", "w", eps, [port("http", 8080)]))
    return tracker_with("n1", *objs).current_state()


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.mode)
@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_each_endpoint_gets_an_equal_share(backend: type, n: int) -> None:
    t = backend(ProxyConfig()).trace(state(n), Packet(CLIENT, ipaddress.ip_address("10.96.0.1"),
                                                      80))  # fmt: skip
    assert set(t.endpoints) == {f"10.1.0.{i + 1}:8080" for i in range(n)}
    assert all(abs(p - 1 / n) < 1e-9 for p in t.endpoints.values()), t.endpoints


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.mode)
def test_no_endpoints_is_a_refusal(backend: type) -> None:
    t = backend(ProxyConfig()).trace(state(0), Packet(CLIENT, ipaddress.ip_address("10.96.0.1"),
                                                      80))  # fmt: skip
    assert t.verdicts == {"reject"} and not t.endpoints


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.mode)
def test_another_address_is_not_pyproxys(backend: type) -> None:
    t = backend(ProxyConfig()).trace(state(2), Packet(CLIENT, ipaddress.ip_address("10.96.0.2"),
                                                      80))  # fmt: skip
    assert t.verdicts == {"accept"} and not t.endpoints


def test_an_unknown_iptables_option_is_an_error() -> None:
    rule = Rule("PREROUTING", (Module("physdev"), Match("--physdev-in", "eth0")), "ACCEPT")
    walker = XtablesWalker({"nat": {"PREROUTING": [rule]}}, (), (), "0x4000")
    with pytest.raises(TraceError, match="--physdev-in"):
        walker.walk(Packet(CLIENT, ipaddress.ip_address("10.96.0.1"), 80))


@dataclass(frozen=True)
class Osf:
    """An expression the walk does not know (``osf name Linux``)."""

    @property
    def text(self) -> str:
        return "osf name Linux"


def test_an_unknown_nft_expression_is_an_error() -> None:
    rule = NftRule((Osf(), Verdict("drop")))  # type: ignore[arg-type]
    table = Table({"prerouting": [(-100, "nat-prerouting")]}, {"nat-prerouting": [rule]})
    with pytest.raises(TraceError, match="osf"):
        NftWalker(table, ()).walk(Packet(CLIENT, ipaddress.ip_address("10.96.0.1"), 80))
