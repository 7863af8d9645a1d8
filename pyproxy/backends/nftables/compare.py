"""``pyproxy diff`` for nftables mode: the kernel's ``kube-proxy`` tables against what pyproxy
would program now. The expected transaction is loaded into a scratch network namespace and
listed back by the same ``nft -s`` (pyproxy.kernel.scratch), so both sides are spelled by nft
itself; chains are compared rule by rule in order, sets and maps by their declaration and by
their elements as sets (element order in a listing carries no meaning)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pyproxy.backends.base import BackendError, Difference, ordered_changes, per_service
from pyproxy.kernel.nft import NftError, list_table
from pyproxy.kernel.scratch import ScratchError, run_in_scratch

OBJECT = re.compile(r"^\s*(chain|set|map|counter|flowtable) (\S+) \{$")
SERVICE = re.compile(r"-[A-Z0-9]{8}-([^/\s]+/[^/\s]+)/")


@dataclass
class NftObject:
    body: list[str] = field(default_factory=list)
    elements: set[str] = field(default_factory=set)


def parse(listing: str) -> dict[str, NftObject]:
    """ "chain NAME" / "map NAME" / ... -> its lines and (sets, maps) its elements."""
    out: dict[str, NftObject] = {}
    current: NftObject | None = None
    collecting = ""
    for raw in listing.splitlines():
        line = raw.strip()
        if collecting or (current is not None and line.startswith("elements = {")):
            collecting += " " + line
            inner = collecting.split("{", 1)[1]
            if "}" in inner:  # the block ends on this line
                assert current is not None
                inner = inner.rsplit("}", 1)[0]
                current.elements |= {e.strip() for e in inner.split(",") if e.strip()}
                collecting = ""
        elif m := OBJECT.match(raw):
            current = out.setdefault(f"{m.group(1)} {m.group(2)}", NftObject())
        elif line == "}":
            current = None
        elif current is not None and line:
            current.body.append(line)
    return out


def _service(*texts: str) -> str:
    for t in texts:
        if m := SERVICE.search(t):
            return m.group(1)
    return ""


def differences(want: dict[str, NftObject], have: dict[str, NftObject], where: str
                ) -> list[Difference]:  # fmt: skip
    out: list[Difference] = []
    for name in sorted(want.keys() | have.keys()):
        w, h = want.get(name), have.get(name)
        obj = f"{where} {name}"
        if w is None or h is None:
            present = w or h
            assert present is not None
            lines = tuple(present.body) + tuple(sorted(present.elements))
            out.append(Difference(_service(name, *lines), obj + (" (missing)" if h is None
                                  else " (not expected)"), lines if h is None else (),
                                  lines if w is None else ()))  # fmt: skip
            continue
        if w.body != h.body:
            missing, unexpected = ordered_changes(w.body, h.body)
            out.append(Difference(_service(name, *missing, *unexpected), obj, missing, unexpected))
        gone = (f"element {e}" for e in sorted(w.elements - h.elements))
        extra = (f"element {e}" for e in sorted(h.elements - w.elements))
        out += per_service(obj, gone, extra, _service)
    return out


def compare(family: str, table: str, transaction: str) -> list[Difference]:
    """The differences for one nftables family (``transaction``: what a full sync into an
    empty namespace writes)."""
    listing = ["nft", "-s", "list", "table", family, table]
    try:
        expected = run_in_scratch([(["nft", "-f", "-"], transaction), (listing, None)])[1]
    except ScratchError as err:
        raise BackendError(str(err)) from None
    try:
        actual = list_table(family, table)
    except NftError as err:
        raise BackendError(str(err)) from None
    where = f"table {family} {table}"
    if actual is None:
        return [Difference("", f"{where} (missing)", ("the whole table",), ())]
    return differences(parse(expected), parse(actual), where)
