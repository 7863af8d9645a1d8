"""Parsing an nft listing into objects, and the differences between two (nft indents with
tabs; written here with spaces, which the parser strips alike)."""

from __future__ import annotations

from pyproxy.backends.nftables.compare import differences, parse

LISTING = """table ip kube-proxy {
    map service-ips {
        type ipv4_addr . inet_proto . inet_service : verdict
        elements = { 10.96.0.10 . tcp . 80 : goto service-AXK6CI2C-x/y/tcp/p,
                 10.96.0.10 . udp . 53 : goto service-BBBBBBBB-x/y/udp/d }
    }
    set cluster-ips {
        type ipv4_addr
        elements = { 10.96.0.10 }
    }
    chain services {
        ip daddr . meta l4proto . th dport vmap @service-ips
    }
}
"""


def test_parse_splits_bodies_and_elements() -> None:
    objs = parse(LISTING)
    assert objs["map service-ips"].body == ["type ipv4_addr . inet_proto . inet_service : verdict"]
    assert objs["map service-ips"].elements == {
        "10.96.0.10 . tcp . 80 : goto service-AXK6CI2C-x/y/tcp/p",
        "10.96.0.10 . udp . 53 : goto service-BBBBBBBB-x/y/udp/d",
    }
    assert objs["set cluster-ips"].elements == {"10.96.0.10"}
    assert objs["chain services"].body == ["ip daddr . meta l4proto . th dport vmap @service-ips"]


def test_a_missing_element_is_named_under_its_service() -> None:
    want = parse(LISTING)
    have = parse(LISTING.replace("10.96.0.10 . tcp . 80 : goto service-AXK6CI2C-x/y/tcp/p,", ""))
    (d,) = differences(want, have, "table ip kube-proxy")
    assert (d.service, d.obj, d.missing, d.unexpected) == (
        "x/y", "table ip kube-proxy map service-ips",
        ("element 10.96.0.10 . tcp . 80 : goto service-AXK6CI2C-x/y/tcp/p",), ())  # fmt: skip
