"""nftables transactions, in process through libnftables (the library ``nft`` itself is built
on), or with ``nft -f -`` when the library cannot be loaded.

Both run the same parser and the same netlink batch, so a transaction is atomic either way;
in process saves the program start and keeps one context for the life of pyproxy. Measured
here (nft 1.0.6, a table of 10,000 service chains): a small transaction costs about 40 ms in
process and 70-160 ms through the program, nearly all of it nft fetching every chain of the
namespace before it adds a rule or an element (its ``evaluate_cache_add``); only ``flush
chain``, ``add chain`` and ``add set`` skip that fetch. See the README's nftables section.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import re
import shutil
import subprocess
import threading

from pyroute2.netlink import NLM_F_REQUEST, nla
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.nfnetlink import NFNL_SUBSYS_NFTABLES, nfgen_msg
from pyroute2.netlink.nfnetlink.nftsocket import (
    NFT_MSG_GETGEN,
    NFT_MSG_GETOBJ,
    NFT_MSG_NEWGEN,
    NFT_MSG_NEWOBJ,
    NFTSocket,
    nft_gen_msg,
)
from pyroute2.nftables.main import NFTables

log = logging.getLogger(__name__)

FAMILIES = {1: "inet", 2: "ip", 3: "arp", 5: "netdev", 7: "bridge", 10: "ip6"}
"""nfproto numbers as nft names them."""
OUTPUT_TERSE = 1 << 11  # NFT_CTX_OUTPUT_TERSE: list sets without their elements
_OBJECT = re.compile(r"^\t(chain|set|map) (\S+) \{$")
_TABLE = re.compile(r"^table (\S+) (\S+) \{$")


class _ObjectMsg(nfgen_msg):  # type: ignore[misc]  # pyroute2 is untyped
    """NFT_MSG_NEWOBJ, which pyroute2 does not decode; counters' data only (type 1)."""

    nla_map = (
        ("NFTA_OBJ_UNSPEC", "none"),
        ("NFTA_OBJ_TABLE", "asciiz"),
        ("NFTA_OBJ_NAME", "asciiz"),
        ("NFTA_OBJ_TYPE", "be32"),
        ("NFTA_OBJ_DATA", "counter"),
        ("NFTA_OBJ_USE", "be32"),
        ("NFTA_OBJ_HANDLE", "be64"),
    )

    class counter(nla):  # type: ignore[misc]
        nla_map = (
            ("NFTA_COUNTER_UNSPEC", "none"),
            ("NFTA_COUNTER_BYTES", "be64"),
            ("NFTA_COUNTER_PACKETS", "be64"),
        )


class NftError(RuntimeError):
    """A transaction the kernel or nft refused; one line for the log."""


def _one_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    if not lines:
        return "failed"
    where = next((ln for ln in lines if ln.startswith(("<cmdline>", "/dev/stdin"))), "")
    return f"{lines[0]} ({where.split(': ', 1)[0]})" if where else lines[0]


class _Library:
    """A libnftables context, loaded with ctypes (the same calls Debian's python3-nftables
    binding makes)."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("nftables") or "libnftables.so.1"
        lib = ctypes.CDLL(name)
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        for fn in ("nft_ctx_buffer_output", "nft_ctx_buffer_error"):
            getattr(lib, fn).argtypes = [ctypes.c_void_p]
        for fn in ("nft_ctx_get_output_buffer", "nft_ctx_get_error_buffer"):
            getattr(lib, fn).argtypes = [ctypes.c_void_p]
            getattr(lib, fn).restype = ctypes.c_char_p
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
        lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        self.lib = lib
        self.ctx = lib.nft_ctx_new(0)
        if not self.ctx:
            raise OSError("nft_ctx_new failed")
        lib.nft_ctx_buffer_output(self.ctx)
        lib.nft_ctx_buffer_error(self.ctx)

    def run(self, text: str, flags: int = 0) -> str:
        self.lib.nft_ctx_output_set_flags(self.ctx, flags)
        rc = self.lib.nft_run_cmd_from_buffer(self.ctx, text.encode())
        out = (self.lib.nft_ctx_get_output_buffer(self.ctx) or b"").decode()
        err = (self.lib.nft_ctx_get_error_buffer(self.ctx) or b"").decode()
        if rc != 0:
            raise NftError(_one_line(err))
        return out


class Nft:
    """Runs nft input (one transaction per call). Thread-safe."""

    def __init__(self, in_process: bool = True) -> None:
        self._lock = threading.Lock()
        self._lib: _Library | None = None
        self.how = "nft -f -"
        if in_process:
            try:
                self._lib = _Library()
                self.how = "libnftables (in process)"
            except OSError as err:
                log.info("libnftables cannot be loaded (%s); using the nft program", err)

    def usable(self) -> str | None:
        """None when transactions can run here, else the reason they cannot."""
        if self._lib is None and shutil.which("nft") is None:
            return "neither libnftables nor the nft program is installed"
        try:
            self.tables()
        except (NftError, OSError) as err:
            return f"nftables does not work here: {err}"
        return None

    def run(self, text: str, flags: int = 0, fresh: bool = False) -> str:
        """One transaction. ``fresh``: in a new ``nft`` process when the program is there (a
        large one: the memory libnftables grows for it is returned when the process ends).
        Never cut short, as upstream's (knftables runs nft under kube-proxy's context.TODO()):
        the kernel's load grows with the square of the services (one anonymous map each: every
        new one scans the table's sets for a free name, and binding it walks the whole
        transaction): 18.8 s at 10,000 here, 98 s at 20,000 and more than 15 minutes at 50,000,
        so a cap that killed it would make the first sync fail at every retry. A hung nft
        shows in /healthz."""
        with self._lock:
            if self._lib is not None and not (fresh and shutil.which("nft")):
                return self._lib.run(text, flags)
            args = ["nft", *(["-t"] if flags & OUTPUT_TERSE else []), "-f", "-"]
            res = subprocess.run(args, input=text, capture_output=True, text=True)
            if res.returncode != 0:
                raise NftError(_one_line(res.stderr))
            return res.stdout

    def names(self, family: str, table: str) -> dict[str, set[str]]:
        """The chain, set and map names of one table (without rules or elements: listing
        those at 10,000 services takes seconds)."""
        out: dict[str, set[str]] = {"chain": set(), "set": set(), "map": set()}
        for what in ("chains", "sets", "maps"):
            current = None
            for line in self.run(f"list {what} {family}\n", OUTPUT_TERSE).splitlines():
                if m := _TABLE.match(line):
                    current = (m.group(1), m.group(2))
                elif (m := _OBJECT.match(line)) and current == (family, table):
                    out[m.group(1)].add(m.group(2))
        return out

    def counters(self, family: str, table: str) -> dict[str, tuple[int, int]]:
        """(packets, bytes) of each named counter of one table, from one netlink dump of the
        family's stateful objects: 2 ms where ``nft list counters`` takes 180 ms at 10,000 service
        chains (it fetches every rule first)."""
        number = next(n for n, name in FAMILIES.items() if name == family)
        try:
            with NFTables(nfgen_family=number) as sock:
                sock.register_policy({NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWOBJ: _ObjectMsg})
                msgs = sock.request_get(_ObjectMsg(), NFT_MSG_GETOBJ)
        except NetlinkError as err:
            raise NftError(f"cannot list nftables counters: {err}") from None
        out = {}
        for m in msgs:
            if m.get_attr("NFTA_OBJ_TABLE") == table and m.get_attr("NFTA_OBJ_TYPE") == 1:
                data = m.get_attr("NFTA_OBJ_DATA")
                out[m.get_attr("NFTA_OBJ_NAME")] = (
                    int(data.get_attr("NFTA_COUNTER_PACKETS")),
                    int(data.get_attr("NFTA_COUNTER_BYTES")),
                )
        return out

    def tables(self) -> set[tuple[str, str]]:
        """(family, name) of every table, from one netlink dump of table headers. Not ``nft
        list tables``: nft 1.0.6 fetches every chain, rule and element to answer it (3.6 s and
        270 MB at 10,000 services, and libnftables keeps the memory)."""
        try:
            with NFTables(nfgen_family=0) as sock:
                msgs = sock.get_tables()
        except NetlinkError as err:
            raise NftError(f"cannot list nftables tables: {err}") from None
        return {
            (FAMILIES.get(m["nfgen_family"], str(m["nfgen_family"])), m.get_attr("NFTA_TABLE_NAME"))
            for m in msgs
        }


def generation() -> int | None:
    """The nf_tables ruleset generation of this network namespace: every committed write to any
    table (nft, iptables-nft, any program) moves it, and reading does not. None when it cannot
    be read. One netlink round trip."""
    try:
        with NFTSocket(nfgen_family=0) as sock:
            sock.register_policy({NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWGEN: nft_gen_msg})
            msgs = sock.request_get(nft_gen_msg(), NFT_MSG_GETGEN, msg_flags=NLM_F_REQUEST)
            return next((int(m.get_attr("NFTA_GEN_ID")) for m in msgs), None)
    except (NetlinkError, OSError):
        return None


def list_table(family: str, table: str) -> str | None:
    """``nft -s list table`` (stateless: no counter values) of this namespace; None when the
    table does not exist. The nft program, as the scratch namespace of ``pyproxy diff`` uses,
    so both sides are printed alike."""
    try:
        res = subprocess.run(["nft", "-s", "list", "table", family, table],
                             capture_output=True, text=True, timeout=600)  # fmt: skip
    except OSError as err:
        raise NftError(f"nft: {err}") from None
    if res.returncode != 0:
        if "No such file or directory" in res.stderr:
            return None
        raise NftError(f"nft list table {family} {table}: {_one_line(res.stderr)}")
    return res.stdout
