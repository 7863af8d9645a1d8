"""``render()`` is pure: ``pyproxy render`` gives the same text as root and as an unprivileged
user whose process cannot open a netlink socket or start a program."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pyproxy.backends import registry

ROOT = Path(__file__).resolve().parents[2]
PYPROXY = str(Path(sys.executable).with_name("pyproxy"))
# nobody, keeping only the right to read files: this machine's Python lives under /root.
NOBODY = [
    "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--no-new-privs",
    "--inh-caps=-all,+dac_read_search", "--ambient-caps=+dac_read_search",
    "--bounding-set=-all,+dac_read_search",
]  # fmt: skip
GUARD = """
import socket, subprocess, os

_init = socket.socket.__init__

def _no_netlink(self, family=-1, *args, **kw):
    if family == socket.AF_NETLINK:
        raise PermissionError("render opened a netlink socket")
    _init(self, family, *args, **kw)

def _no_programs(*args, **kw):
    raise PermissionError("render started a program")

socket.socket.__init__ = _no_netlink
subprocess.Popen.__init__ = _no_programs
os.execv = os.execve = os.posix_spawn = _no_programs
"""


def render(mode: str, *prefix: str, env: dict[str, str] | None = None) -> str:
    args = ["render", f"--mode={mode}", "--manifests", str(ROOT / "examples"), "--node", "node-a"]
    res = subprocess.run(
        [*prefix, PYPROXY, *args, "--cluster-cidr", "10.244.0.0/16,fd00:244::/48"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to compare with an unprivileged user")
@pytest.mark.parametrize("mode", [m.name for m in registry.modes()])
def test_render_needs_no_privilege_kernel_or_program(mode: str, tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(GUARD))
    tmp_path.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    as_root = render(mode)
    guarded = render(mode, *NOBODY, env=env)
    assert guarded == as_root
    assert "10.96.0.10" in as_root  # the example service, not an empty render
