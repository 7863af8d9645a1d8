"""ebpf mode: nftables mode's table, plus socket-level balancing by cgroup BPF programs."""

from __future__ import annotations

from pyproxy.backends.base import Backend
from pyproxy.backends.mode import Mode
from pyproxy.config.load import Setting, boolean
from pyproxy.config.settings import ProxyConfig
from pyproxy.model.nodeports import NodePortAddresses


def _outlives(cfg: ProxyConfig) -> int:
    from pyproxy.backends.ebpf.programs import remove_pins

    return remove_pins(cfg)


def _create(cfg: ProxyConfig) -> Backend:
    from pyproxy.backends.ebpf.backend import EbpfBackend

    return EbpfBackend(cfg)


MODE = Mode(
    "ebpf",
    _create,
    masquerade_section="nftables",
    nodeport_default=NodePortAddresses(primary=True),  # the rules are nftables mode's
    settings=(
        Setting(
            "bpf_cgroup",
            "--bpf-cgroup",
            "ebpf.cgroup",
            "",
            str,
            "cgroup v2 directory the socket programs attach to (ebpf mode; default: the root "
            "of the first cgroup2 mount: every process on the node).",
        ),
        Setting(
            "bpf_pin_dir",
            "--bpf-pin-dir",
            "ebpf.pinDir",
            "",
            str,
            "Directory in a bpffs where the socket programs' links and maps are pinned (ebpf "
            "mode; default /sys/fs/bpf/pyproxy, mounting a bpffs at /sys/fs/bpf if needed).",
        ),
        Setting(
            "bpf_socket_affinity",
            "--bpf-socket-affinity",
            "ebpf.socketAffinity",
            False,
            boolean,
            "Balance ClientIP-affinity services at the socket too (ebpf mode; default: the "
            "rules balance them, whose affinity the programs cannot share: see the README).",
        ),
    ),
    leftovers=("iptables", "ipvs"),
    outlives=_outlives,
)
