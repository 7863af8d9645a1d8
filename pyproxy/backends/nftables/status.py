"""``pyproxy status`` in nftables mode: the service ports' named counters
(``--service-metrics``), both families."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from pyproxy.backends.base import BackendUnavailable, ServiceTraffic, by_service_port
from pyproxy.backends.nftables.names import counted_port, is_service_counter
from pyproxy.backends.nftables.render import TABLE
from pyproxy.kernel.nft import Nft, NftError


def counters() -> tuple[str, Any, str]:
    """("nftables", per service port what its counter saw, the text report)."""
    seen = read_nft()
    return "nftables", {k: asdict(v) for k, v in seen.items()}, nft_report(seen)


def read_nft() -> dict[str, ServiceTraffic]:
    """nftables mode: the service ports' named counters (--service-metrics), both families."""
    nft = Nft()
    try:
        values = [(n, v) for family in ("ip", "ip6")
                  for n, v in nft.counters(family, TABLE).items()]  # fmt: skip
    except NftError as err:
        raise BackendUnavailable(str(err)) from None
    return by_service_port((counted_port(name), ServiceTraffic(p, p, b))
                           for name, (p, b) in values if is_service_counter(name))  # fmt: skip


def nft_report(seen: Mapping[str, ServiceTraffic]) -> str:
    if not seen:
        return ("no per-service counters in table kube-proxy (pyproxy counts per service in "
                "nftables mode with --service-metrics)\n")  # fmt: skip
    out = [f"{'SERVICE PORT':40} {'CONNECTIONS':>11} {'BYTES':>12}"]
    out += [f"{name:40} {t.connections:>11} {t.bytes or 0:>12}" for name, t in sorted(seen.items())]
    return "\n".join(out) + "\n"
