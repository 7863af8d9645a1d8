"""The HTTP endpoints on a wildcard address answer in both families, as upstream's Go
listeners do: kube-proxy's default healthzBindAddress 0.0.0.0:10256 answers a kubelet's probe
to the node's IPv6 address (in an IPv6 cluster pyproxy's pods were never Ready before this).
Run in a network namespace of its own, on its loopback."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.netns

CHECK = r"""
import urllib.request
from pyproxy.serving.health import serve
for host in ("0.0.0.0", "::", "127.0.0.1", "::1"):
    s = serve(host, 0, lambda p, q: (200, "text/plain", b"ok"), "t")
    port = s.server_address[1]
    for url in (f"http://127.0.0.1:{port}/", f"http://[::1]:{port}/"):
        try:
            body = urllib.request.urlopen(url, timeout=5).read().decode()
        except OSError as err:
            body = type(err).__name__
        print(host, url.split("//")[1].rsplit(":", 1)[0], body)
    s.shutdown()
"""


def test_a_wildcard_address_answers_ipv4_and_ipv6() -> None:
    res = subprocess.run(
        ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "-",
         sys.executable, "-c", CHECK],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert res.stdout.splitlines() == [
        "0.0.0.0 127.0.0.1 ok",
        "0.0.0.0 [::1] ok",
        ":: 127.0.0.1 ok",
        ":: [::1] ok",
        "127.0.0.1 127.0.0.1 ok",
        "127.0.0.1 [::1] URLError",
        "::1 127.0.0.1 URLError",
        "::1 [::1] ok",
    ]
