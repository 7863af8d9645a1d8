"""Run a command inside user-mode Linux: a Linux kernel that runs as an ordinary process,
with the host's filesystem as its root (hostfs), its own network stack, and the IPVS, ipset
and dummy modules this machine's kernel lacks (Debian's ``user-mode-linux`` package).

Inside the guest: /proc, /sys, /dev and a fresh /run (so ``ip netns`` there never writes the
host's /run/netns) are mounted, module auto-loading goes through ``modprobe -d`` on the
package's module tree, and iptables must use the legacy back end (no nf_tables for IPv4).
The command's output and exit status come back through files in a host temp directory; the
guest powers itself off, and a time limit kills it otherwise.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

UML = shutil.which("linux.uml") or "/usr/bin/linux.uml"
MODULES = Path("/usr/lib/uml/modules")
ROOT = Path(__file__).resolve().parents[2]
PRELOAD = (
    "ip_vs ip_vs_rr ip_vs_wrr ip_vs_lc ip_vs_wlc ip_vs_lblc ip_vs_lblcr ip_vs_dh ip_vs_sh "
    "ip_vs_sed ip_vs_nq ip_vs_mh dummy veth bridge nf_conntrack nf_nat xt_conntrack "
    "xt_comment xt_mark xt_addrtype xt_set ip_set ip_set_hash_ip ip_set_hash_ipport "
    "ip_set_hash_ipportip ip_set_hash_ipportnet ip_set_bitmap_port ip_set_hash_net "
    "iptable_nat iptable_filter iptable_mangle ipt_MASQUERADE ipt_REJECT xt_MASQUERADE "
    "nf_conntrack_netlink xt_statistic xt_recent ip6table_nat ip6table_filter"
)


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if not Path(UML).exists() or not MODULES.is_dir():
        return "user-mode-linux is not installed (make install as root)"
    return None


@dataclass
class Result:
    rc: int
    output: str
    console: str


def run(command: str, timeout: float = 600, mem: str = "1536M") -> Result:
    work = Path(tempfile.mkdtemp(prefix="pyproxy-uml-"))
    try:
        mods = work / "mods"
        (mods / "lib").mkdir(parents=True)
        (mods / "lib" / "modules").symlink_to(MODULES)
        wrapper = work / "modprobe"
        wrapper.write_text(f'#!/bin/sh\nexec /sbin/modprobe -d {mods} "$@"\n')
        wrapper.chmod(0o755)
        venv_bin = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin"
        init = work / "init"
        init.write_text(f"""#!/bin/sh
export PATH={venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root PYTHONDONTWRITEBYTECODE=1 PYPROXY_IN_UML=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs tmpfs /run
mkdir -p /run/netns /run/lock
echo {wrapper} > /proc/sys/kernel/modprobe
for m in {PRELOAD}; do modprobe -d {mods} $m 2>/dev/null; done
ip link set lo up
cd {shlex.quote(str(ROOT))}
( {command} ) > {work}/output 2>&1
echo $? > {work}/rc
sync
echo o > /proc/sysrq-trigger
sleep 5
""")
        init.chmod(0o755)
        cmd = [
            UML,
            f"mem={mem}",
            "root=/dev/root",
            "rootfstype=hostfs",
            "rootflags=/",
            "rw",
            f"init={init}",
            "con=null",
            "con0=null,fd:1",
            f"umid=pyproxy{os.getpid()}",
            "quiet",
        ]
        # Its own session: whatever ends the wait (its timeout, pytest-timeout, ^C), the
        # guest's processes (one per guest thread) are all killed on the way out.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", stdin=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip
        try:
            console, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            console = f"killed after {timeout}s\n"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out = (work / "output").read_text(errors="replace") if (work / "output").exists() else ""
        rc_file = work / "rc"
        rc = int(rc_file.read_text().strip()) if rc_file.exists() else -1
        return Result(rc, out, console)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(Path.home() / ".uml" / f"pyproxy{os.getpid()}", ignore_errors=True)
