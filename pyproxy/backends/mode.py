"""What a mode declares about itself, in one place (its folder's ``mode.py``): its name, how
its backend is built, its configuration sections and own settings, what of other modes' a
start removes (and what of its own any other mode's start removes), and how ``pyproxy
status`` reads its kernel's counters. The command line, the
configuration loader and the tools read modes only through these declarations
(``pyproxy.backends.registry``), so adding a mode is a folder and one line there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyproxy.backends.base import Backend
from pyproxy.config.load import Setting
from pyproxy.config.settings import ProxyConfig
from pyproxy.model.nodeports import NodePortAddresses

Counters = Callable[[ProxyConfig], tuple[str, Any, str]]
"""``pyproxy status``'s kernel part: (its key in the JSON document, its value there, its text
report); BackendError (one line) when the kernel's counters cannot be read here."""


@dataclass(frozen=True)
class Mode:
    name: str
    create: Callable[[ProxyConfig], Backend]
    """Builds the backend; imports it lazily, so a mode's dependencies load only when it
    runs."""
    sync_section: str = ""
    """The configuration file's section with minSyncPeriod and syncPeriod (default: the
    mode's name)."""
    masquerade_section: str = "iptables"
    nodeport_default: NodePortAddresses = field(default_factory=NodePortAddresses)
    settings: tuple[Setting, ...] = ()
    leftovers: tuple[str, ...] = ()
    """Modes whose objects a start in this mode removes (upstream's platformCleanup)."""
    outlives: Callable[[ProxyConfig], int] | None = None
    """Removes what this mode leaves in the kernel that would go on serving after its
    process, under any other mode (ebpf's pinned socket programs, which keep connecting
    sockets from maps nobody updates); returns how many objects went. A start in any other
    mode calls it, as it removes its ``leftovers``."""
    counters: Counters | None = None
    """None: the kernel keeps no counters this mode can show (ask the daemon)."""

    def __post_init__(self) -> None:
        if not self.sync_section:
            object.__setattr__(self, "sync_section", self.name)
