"""Copy into a new root filesystem only what pyproxy runs: the Python interpreter and the parts
of its standard library a daemon can import, pyproxy's virtualenv, the netfilter tools pyproxy
calls (iptables/ip6tables of both back ends, nft and libnftables, conntrack, modprobe),
libbpf for ebpf mode's programs (compiled in the build stage, shipped in the package), the
shared libraries all of these load (found with ldd), and a few files from /etc. The image's
last stage is this tree on ``scratch``: no shell, no package manager, no compiler (510 MB on
the Debian base before, see the README for the figure now).

Run in the Dockerfile's build stage: ``python3 deploy/image_rootfs.py VENV ROOT``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

TOOLS = [
    f"{base}-{backend}{suffix}"
    for base in ("iptables", "ip6tables")
    for backend in ("nft", "legacy")
    for suffix in ("", "-restore", "-save")
] + ["nft", "conntrack", "modprobe"]
STDLIB_UNUSED = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3",
                 "pydoc_data", "distutils", "venv", "dbm", "curses",
                 "__phello__", "site-packages", "dist-packages"}  # fmt: skip
ETC = ["passwd", "group", "nsswitch.conf", "protocols", "services", "hosts", "ld.so.conf",
       "ld.so.conf.d", "ssl/certs/ca-certificates.crt", "ethertypes"]  # fmt: skip
LIBS = ["libnftables.so.1", "libbpf.so.1"]  # loaded with ctypes, not linked
PLUGIN_DIRS = ["xtables"]  # iptables extensions, dlopened by name


def copy(path: Path, root: Path, seen: set[Path]) -> None:
    """Copy ``path`` (a file, directory or symlink chain) to the same place under ``root``."""
    parent = Path(os.path.realpath(path.parent))
    path = parent / path.name  # /lib/x -> /usr/lib/x where /lib is a link (merged /usr)
    if path in seen or not os.path.lexists(path):
        return
    seen.add(path)
    dest = root / parent.relative_to("/") / path.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        target = os.readlink(path)
        if not os.path.lexists(dest):
            dest.symlink_to(target)
        copy(parent / target if not os.path.isabs(target) else Path(target), root, seen)
    elif path.is_dir():
        shutil.copytree(path, dest, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copy2(path, dest)


def needed_libraries(elf: Path) -> set[Path]:
    res = subprocess.run(["ldd", str(elf)], capture_output=True, text=True)
    out = set()
    for line in res.stdout.splitlines():
        words = line.split()
        if "=>" in words and len(words) > words.index("=>") + 1:
            out.add(Path(words[words.index("=>") + 1]))
        elif words and words[0].startswith("/"):
            out.add(Path(words[0]))
    return {p for p in out if p.is_absolute() and p.exists()}


def is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def main(venv: Path, root: Path) -> None:
    seen: set[Path] = set()
    for d in ("usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "tmp", "run", "var", "proc", "sys",
              "dev"):  # the last three: mount points a runtime needs on a read-only root
        (root / d).mkdir(parents=True, exist_ok=True)
    for link, target in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"),
                         ("lib64", "usr/lib64")):  # fmt: skip
        if not os.path.lexists(root / link):
            (root / link).symlink_to(target)
    (root / "tmp").chmod(0o1777)
    multiarch = sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu"
    libdirs = [Path("/usr/lib") / multiarch, Path("/lib") / multiarch, Path("/usr/local/lib")]

    copy(Path(sys.executable), root, seen)
    copy(Path(os.path.realpath(sys.executable)), root, seen)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for entry in stdlib.iterdir():
        if entry.name not in STDLIB_UNUSED and not entry.name.startswith("config-"):
            copy(entry, root, seen)
    copy(venv, root, seen)
    for tool in TOOLS:
        found = shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin")
        if found is None:
            raise SystemExit(f"image_rootfs: {tool} is not installed in the build stage")
        copy(Path(found), root, seen)
    for name in LIBS:
        copy(next(d / name for d in libdirs if (d / name).exists()), root, seen)
    for name in PLUGIN_DIRS:
        for d in libdirs:
            copy(d / name, root, seen)
    for name in ETC:
        copy(Path("/etc") / name, root, seen)

    # Every ELF file now in the tree, and every library it needs, until nothing is missing.
    done: set[Path] = set()
    while True:
        elves = {p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and is_elf(p)}
        todo = elves - done
        if not todo:
            break
        for elf in todo:
            for lib in needed_libraries(elf):
                copy(lib, root, seen)
        done |= todo
    subprocess.run(["ldconfig", "-r", str(root)], check=True)
    # What is left out must not be needed: every pyproxy module imports inside the new root,
    # and each tool starts there.
    subprocess.run(["chroot", str(root), "/opt/pyproxy/bin/python", "-c", IMPORT_ALL], check=True)
    for tool in TOOLS:
        subprocess.run(["chroot", str(root), tool, "--version"], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip


IMPORT_ALL = """
import importlib, pkgutil, pyproxy
for m in pkgutil.walk_packages(pyproxy.__path__, "pyproxy."):
    if not m.name.endswith(".__main__"):
        importlib.import_module(m.name)
"""


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
