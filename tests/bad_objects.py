"""Services and EndpointSlices that are bad by construction, as hypothesis strategies: a valid
object with one field the proxy reads set to a value the API's schema forbids (a wrong type, an
address that is no IP, a port out of range, a protocol or type that does not exist). Every
one must be skipped, with one log line and one count. Shared by the unit property test and the
namespace test that feeds 10,000 of them to a running daemon."""

from __future__ import annotations

import copy
import ipaddress
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.helpers import endpoint, endpoint_slice, port, service

NODE = "node-a"
TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12)


def _not_ip(t: str) -> bool:
    try:
        ipaddress.ip_address(t)
    except ValueError:
        return t != "None"
    return False


NOT_IP = TEXT.filter(_not_ip)
WORD = st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=10)
NONZERO = st.integers(-(2**40), 2**40).filter(bool)
NOT_A_LIST = TEXT | NONZERO | st.just(True) | st.dictionaries(WORD, TEXT, min_size=1, max_size=2)
NOT_A_MAPPING = TEXT | NONZERO | st.just(True) | st.lists(TEXT, min_size=1, max_size=2)
BAD_PORT = st.integers(-(2**20), 2**20).filter(lambda n: not 1 <= n <= 65535) | WORD
BAD_PROTOCOL = WORD.filter(lambda w: w.upper() not in ("TCP", "UDP", "SCTP")) | NONZERO

SERVICE_FIELDS: dict[tuple[str | int, ...], st.SearchStrategy[Any]] = {
    ("spec",): NOT_A_MAPPING,
    ("spec", "ports"): NOT_A_LIST,
    ("spec", "ports", 0): NOT_A_MAPPING,
    ("spec", "ports", 0, "port"): BAD_PORT,
    ("spec", "ports", 0, "protocol"): BAD_PROTOCOL,
    ("spec", "clusterIP"): NOT_IP | NONZERO,
    ("spec", "type"): WORD.filter(
        lambda w: w not in ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")
    ),
}
SLICE_FIELDS: dict[tuple[str | int, ...], st.SearchStrategy[Any]] = {
    ("endpoints",): NOT_A_LIST,
    ("endpoints", 0): NOT_A_MAPPING,
    ("endpoints", 0, "addresses"): NOT_A_LIST,
    ("endpoints", 0, "addresses", 0): NOT_IP | NONZERO,
    ("addressType",): WORD.filter(lambda w: w not in ("IPv4", "IPv6", "FQDN")),
    ("ports", 0, "port"): BAD_PORT,
}


def valid(kind: str, name: str, i: int) -> dict[str, Any]:
    if kind == "Service":
        return service("junk", name, f"10.97.{i // 250 % 250}.{i % 250 + 1}",
                       [port("http", 80, nodePort=30000 + i % 2000), port("dns", 53, "UDP")],
                       type="NodePort")  # fmt: skip
    return endpoint_slice("junk", name, f"{name}-1",
                          [endpoint(f"10.1.{i // 250 % 250}.{i % 250 + 1}", node=NODE)],
                          [port("http", 8080), port("dns", 5353, "UDP")])  # fmt: skip


@st.composite
def bad_object(draw: st.DrawFn, name: str = "bad", i: int = 0) -> dict[str, Any]:
    kind = draw(st.sampled_from(["Service", "EndpointSlice"]))
    fields = SERVICE_FIELDS if kind == "Service" else SLICE_FIELDS
    path = draw(st.sampled_from(sorted(fields, key=str)))
    obj = copy.deepcopy(valid(kind, name, i))
    target: Any = obj
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = draw(fields[path])
    return obj


def generate(n: int) -> list[dict[str, Any]]:
    """``n`` bad objects named bad-0 ... bad-(n-1), drawn by hypothesis (one example each)."""
    out: list[dict[str, Any]] = []

    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(st.data())
    def draw(data: st.DataObject) -> None:
        if len(out) < n:
            out.append(data.draw(bad_object(f"bad-{len(out)}", len(out))))

    while len(out) < n:  # hypothesis may stop early when it thinks it has seen enough
        draw()
    return out
