"""The checking fake of the nft port refuses what the kernel refuses (the same list
``tests/netns/test_nft_refusals.py`` holds this machine's kernel to), and a refused
transaction changes nothing in it."""

from __future__ import annotations

import copy

import pytest

from pyproxy.kernel.nft import NftError
from pyproxy.kernel.nft_fake import FakeNft
from tests.nft_refusals import CASES, SETUP


@pytest.mark.parametrize(("what", "text", "refused"), CASES, ids=[c[0] for c in CASES])
def test_the_fake_refuses_what_the_kernel_refuses(what: str, text: str, refused: bool) -> None:
    nft = FakeNft()
    nft.run(SETUP)
    before = copy.deepcopy(nft.tables_)
    if refused:
        with pytest.raises(NftError):
            nft.run(text)
        assert nft.tables_ == before, f"{what}: a refused transaction changed the fake"
        assert nft.runs == [SETUP]
    else:
        nft.run(text)
        assert nft.runs == [SETUP, text]


def test_the_fake_holds_what_was_written() -> None:
    nft = FakeNft()
    nft.run(SETUP)
    t = nft.table("ip", "t")
    assert t.chains["a"].rules == ["jump b", "ip daddr @ips accept", "counter name k"]
    assert t.chains["hooked"].base == "type filter hook input priority 0"
    assert t.sets["verdicts"].elements == {"10.0.0.1 . tcp . 80": "goto b"}
    assert nft.names("ip", "t") == {"chain": {"a", "b", "hooked"}, "set": {"ips", "nets"},
                                    "map": {"verdicts"}}  # fmt: skip
    assert nft.names("ip6", "t") == {"chain": set(), "set": set(), "map": set()}
    assert nft.tables() == {("ip", "t")}
    assert nft.listings == 3
