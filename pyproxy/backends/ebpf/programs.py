"""The socket programs on the host: loaded from ``bpf/sock_lb.o``, attached to a cgroup v2
directory through pinned links, their maps pinned beside them, so that they outlive the
process: a restart finds them attached and filled, adopts the maps (libbpf reuses a pinned
map) and swaps the programs behind the links in one step. Nothing is detached on exit, as
kube-proxy leaves its rules; ``remove`` (``pyproxy cleanup --mode=ebpf``) detaches and unpins
everything under the pin directory, and nothing else."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from pyproxy.config.settings import ProxyConfig
from pyproxy.kernel import bpf_mounts
from pyproxy.kernel.bpf import BpfError, Map
from pyproxy.kernel.libbpf import BpfObject, Link

log = logging.getLogger(__name__)

OBJECT = Path(__file__).parent / "bpf" / "sock_lb.o"
PROGRAMS = ("connect4", "sendmsg4", "recvmsg4", "getpeername4",
            "connect6", "sendmsg6", "recvmsg6", "getpeername6")  # fmt: skip
MAPS = ("services", "members", "reverse", "affinity", "counts")
DEFAULT_PIN_DIR = "/sys/fs/bpf/pyproxy"


def pin_dir(cfg: ProxyConfig) -> str:
    """``--bpf-pin-dir``, or the default."""
    return str(cfg.option("bpf_pin_dir", "") or DEFAULT_PIN_DIR)


def remove_pins(cfg: ProxyConfig) -> int:
    """What a start in another mode does (``Mode.outlives``): the programs and maps pinned in
    ``cfg``'s pin directory go, when that directory lies in a bpffs (nothing is mounted or
    created to look)."""
    where = pin_dir(cfg)
    if bpf_mounts.bpffs_of(where) is None:
        return 0
    return SocketPrograms("", where).remove()


class SocketPrograms:
    def __init__(self, cgroup: str, pin_dir: str = DEFAULT_PIN_DIR, obj: Path = OBJECT) -> None:
        self.cgroup = cgroup
        self.pin_dir = pin_dir
        self.obj = obj

    def unusable(self) -> str | None:
        """Why the programs cannot run here (one line), or None."""
        if not self.obj.exists():
            return f"{self.obj} is not built (make install compiles it with clang)"
        if not bpf_mounts.is_cgroup2(self.cgroup):
            return f"--bpf-cgroup {self.cgroup} is not a cgroup v2 directory"
        return None

    def _bpffs(self) -> None:
        if bpf_mounts.bpffs_of(self.pin_dir) is None:
            parent = str(Path(self.pin_dir).parent)
            log.info("mounting a bpffs at %s", parent)
            bpf_mounts.mount_bpffs(parent)
        os.makedirs(self.pin_dir, exist_ok=True)

    def open(self) -> tuple[Map, Map, Map]:
        """Load and attach (or adopt and update) the programs; the ``services``, ``members``
        and ``counts`` maps."""
        self._bpffs()
        pins = {m: os.path.join(self.pin_dir, m) for m in MAPS}
        with BpfObject(str(self.obj), pins) as obj:
            for program in PROGRAMS:
                pin = os.path.join(self.pin_dir, f"link_{program}")
                if os.path.exists(pin):
                    link = Link.open(pin)
                    try:
                        obj.update_link(link, program)
                    finally:
                        link.destroy()  # the pin keeps it attached
                    continue
                link = obj.attach_cgroup(program, self.cgroup)
                try:
                    link.pin(pin)
                finally:
                    link.destroy()
            log.info("socket programs attached to %s (pinned in %s)", self.cgroup, self.pin_dir)
            return obj.map("services"), obj.map("members"), obj.map("counts")

    def remove(self) -> int:
        """Detach and unpin what this pin directory holds; how many pins went."""
        if not os.path.isdir(self.pin_dir):
            return 0
        n = 0
        for name in (*(f"link_{p}" for p in PROGRAMS), *MAPS):
            try:
                os.unlink(os.path.join(self.pin_dir, name))
                n += 1
            except FileNotFoundError:
                pass
        try:
            os.rmdir(self.pin_dir)
        except OSError as err:
            if err.errno != errno.ENOENT:
                raise BpfError(err.errno or 0, f"cannot remove {self.pin_dir}: {err}") from None
        return n
