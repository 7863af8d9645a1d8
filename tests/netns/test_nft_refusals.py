"""This kernel refuses exactly the transactions of ``tests/nft_refusals.py`` that the unit
suite's checking fake (``pyproxy.kernel.nft_fake``) refuses, and a refused one changes
nothing: the fake's refusals are the kernel's, measured here, not assumed."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from tests.nft_refusals import CASES, SETUP


def nft(ns: str, *args: str, text: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", ns, "nft", *args], input=text, text=True,
                          capture_output=True, timeout=30)  # fmt: skip


@pytest.fixture(scope="module")
def ns() -> Iterator[str]:
    name = f"pyk-nftref-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.mark.parametrize(("what", "text", "refused"), CASES, ids=[c[0] for c in CASES])
def test_the_kernel_refuses_what_the_fake_refuses(
    ns: str, what: str, text: str, refused: bool
) -> None:
    assert nft(ns, "flush", "ruleset").returncode == 0
    setup = nft(ns, "-f", "-", text=SETUP)
    assert setup.returncode == 0, setup.stderr
    before = nft(ns, "-s", "list", "ruleset").stdout
    res = nft(ns, "-f", "-", text=text)
    assert (res.returncode != 0) == refused, f"{what}: rc={res.returncode} {res.stderr}"
    if refused:
        assert nft(ns, "-s", "list", "ruleset").stdout == before
