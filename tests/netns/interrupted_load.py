"""Run inside a node namespace (``python -m tests.netns.interrupted_load``): a full sync of the
iptables backend in small ordered transactions, with the restore tool failing after
``--fail-after`` of them (as if killed), then what the kernel's nat table holds, as JSON on
stdout. A large ``--fail-after`` lets the sync complete.

Used by test_cold_start.py; the traffic checks are done from the test, with real packets.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pyproxy.backends.base import BackendError, SyncRequest
from pyproxy.backends.iptables import backend as iptables_backend
from pyproxy.backends.iptables.backend import IptablesBackend
from pyproxy.config.settings import ProxyConfig
from pyproxy.kernel.iptables import Iptables, IptablesError
from pyproxy.model.types import IPFamily
from pyproxy.sources.manifests import ManifestsSource
from pyproxy.sync.tracker import ChangeTracker
from tests.netns.world import CLUSTER_CIDR


class Failing(Iptables):
    """The real tool, failing on the transaction after ``allowed`` succeeded."""

    def restore(self, data: str, counters: bool = True) -> None:
        left: list[int] = self.left  # type: ignore[attr-defined]
        if left[0] == 0:
            raise IptablesError("iptables-nft-restore: killed (injected by the test)")
        left[0] -= 1
        super().restore(data, counters)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("manifests")
    ap.add_argument("--fail-after", type=int, required=True)
    ap.add_argument("--batch-lines", type=int, default=60)
    args = ap.parse_args()
    iptables_backend.BATCH_LINES = args.batch_lines
    import ipaddress
    from pathlib import Path

    tracker = ChangeTracker("node-a")
    ManifestsSource(Path(args.manifests), tracker.apply).initial()
    cfg = ProxyConfig(cluster_cidrs=(ipaddress.ip_network(CLUSTER_CIDR),), iptables_backend="nft")
    failing = Failing("nft")
    object.__setattr__(failing, "left", [args.fail_after])
    backend = IptablesBackend(cfg, tables={IPFamily.IPV4: failing})
    out: dict[str, Any] = {}
    state = tracker.current_state()
    try:
        backend.sync(SyncRequest(state, full=True))
        out["first"] = "ok"
    except BackendError as err:
        out["first"] = str(err)
    programmed = backend.programmed(IPFamily.IPV4)
    assert programmed is not None
    out["transactions"] = len(programmed.batches(max_lines=args.batch_lines))
    out["nat"] = Iptables("nft").save("nat")
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
