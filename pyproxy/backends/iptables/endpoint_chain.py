"""Endpoint chains (KUBE-SEP-*) as the few facts their two rules are made of.

A large table has one endpoint chain per endpoint and port (100,000 at 10,000 services x 10
endpoints), and the rules of a port's endpoint chains differ only in the chain, the
endpoint's address and its address:port. So an ``EndpointChain`` holds those three strings
and the port's ``EndpointRules``, instead of two ``Rule`` tuples with their own conditions
and target options: the rendered table stays as small as the text it replaced. Its rules are
made when asked for (``trace`` walks them); its restore text comes from a per-port template
made by ``Rule.text`` itself, so the two cannot disagree. Pure: no kernel.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import cached_property
from typing import overload

from pyproxy.backends.xtables.rule import Match, Part, Rule, fixed, module
from pyproxy.backends.xtables.rules import KUBE_MARK_MASQ

# Stand-ins for an endpoint's own words in a port's text template: no name, address or
# comment pyproxy writes contains a control character.
_CHAIN, _SOURCE, _DESTINATION = "\x00", "\x01", "\x02"


class EndpointRules:
    """What the endpoint chains of one service port share: the comment both rules start
    with (none in a large table), the protocol, and whether the port has session affinity
    (then the DNAT rule also remembers the client under the chain's name)."""

    def __init__(self, named: tuple[Part, ...], proto: str, affinity: bool) -> None:
        self.named = named
        self.proto = proto
        self.affinity = affinity

    def masquerade(self, chain: str, source: str) -> Rule:
        """Hairpin traffic (the endpoint reaching its own service) is masqueraded."""
        return Rule(chain, (*self.named, Match("-s", source)), KUBE_MARK_MASQ)

    def dnat(self, chain: str, destination: str) -> Rule:
        parts = self._dnat_parts
        if self.affinity:
            recent = (module("recent"), Match("--name", chain), fixed("--set"))
            parts = (*self.named, *recent, *parts[len(self.named) :])
        return Rule(chain, parts, "DNAT", ("--to-destination", destination))

    @cached_property
    def _dnat_parts(self) -> tuple[Part, ...]:
        """Without affinity, one tuple for every endpoint of the port."""
        return (*self.named, module(self.proto), fixed("-p", self.proto))

    @cached_property
    def _templates(self) -> tuple[str, str]:
        return (
            self.masquerade(_CHAIN, _SOURCE).text,
            self.dnat(_CHAIN, _DESTINATION).text,
        )

    def lines(self, chain: EndpointChain) -> list[str]:
        """The chain's restore lines, the same as its rules' ``text``: a full sync writes
        100,000 of these at 10,000 services, so they are filled in, not formatted."""
        masq, dnat = self._templates
        return [
            masq.replace(_CHAIN, chain.chain).replace(_SOURCE, chain.source),
            dnat.replace(_CHAIN, chain.chain).replace(_DESTINATION, chain.destination),
        ]


class EndpointChain(Sequence[Rule]):
    """``-A SEP [comment] -s IP -j KUBE-MARK-MASQ``, then
    ``-A SEP [comment] [affinity] -m PROTO -p PROTO -j DNAT --to-destination IP:PORT``."""

    __slots__ = ("chain", "destination", "port", "source")

    def __init__(self, port: EndpointRules, chain: str, source: str, destination: str) -> None:
        self.port = port
        self.chain = chain
        self.source = source
        """The endpoint's address (``-s``)."""
        self.destination = destination
        """``IP:PORT`` (``[IPv6]:PORT``) of the DNAT."""

    def lines(self) -> list[str]:
        return self.port.lines(self)

    def __len__(self) -> int:
        return 2

    def __iter__(self) -> Iterator[Rule]:
        yield self.port.masquerade(self.chain, self.source)
        yield self.port.dnat(self.chain, self.destination)

    @overload
    def __getitem__(self, index: int) -> Rule: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Rule]: ...
    def __getitem__(self, index: int | slice) -> Rule | Sequence[Rule]:
        return list(self)[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # compared by its rules, like a list

    def __repr__(self) -> str:
        return f"EndpointChain({list(self)!r})"


def lines(rules: Sequence[Rule]) -> list[str]:
    """A chain's restore lines (``-A CHAIN ...``)."""
    if isinstance(rules, EndpointChain):
        return rules.lines()
    return [r.text for r in rules]
