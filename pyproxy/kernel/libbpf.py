"""BPF programs through libbpf (Debian's ``libbpf1``), with ctypes: open a compiled object,
load it, attach its cgroup programs, pin what must outlive the process.

libbpf does what is error-prone to write again: the ELF sections, BTF-defined maps, map
relocations in the instructions, and the kernel's verifier log. Only the few calls the ebpf
mode needs are declared. Errors come back as ``BpfError`` naming the call and the errno.
"""

from __future__ import annotations

import ctypes
import os

from pyproxy.kernel.bpf import BpfError, Map, map_info

_lib: ctypes.CDLL | None = None


def _libbpf() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
        except OSError as err:
            raise BpfError(0, f"libbpf.so.1 cannot be loaded ({err}): install libbpf1") from None
        vp, cp, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
        for name, res, args in (
            ("bpf_object__open_file", vp, [cp, vp]),
            ("bpf_object__load", i, [vp]),
            ("bpf_object__close", None, [vp]),
            ("bpf_object__find_program_by_name", vp, [vp, cp]),
            ("bpf_object__find_map_by_name", vp, [vp, cp]),
            ("bpf_map__fd", i, [vp]),
            ("bpf_map__set_pin_path", i, [vp, cp]),
            ("bpf_program__fd", i, [vp]),
            ("bpf_program__attach_cgroup", vp, [vp, i]),
            ("bpf_link__pin", i, [vp, cp]),
            ("bpf_link__fd", i, [vp]),
            ("bpf_link__destroy", i, [vp]),
            ("bpf_link__open", vp, [cp]),
            ("bpf_link__update_program", i, [vp, vp]),
            ("libbpf_set_print", vp, [vp]),
        ):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        _lib = lib
    return _lib


def _check(call: str, ok: bool) -> None:
    if not ok:
        err = ctypes.get_errno()
        raise BpfError(err, f"{call}: {os.strerror(err) if err else 'failed'}")


_PRINT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_libc = ctypes.CDLL(None)
_libc.vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]


class Link:
    """One program attached (a bpf_link). Pinned, it stays attached after the process ends;
    ``destroy`` closes the process's handle (and detaches it when it was not pinned)."""

    def __init__(self, handle: int, name: str) -> None:
        self._handle: int | None = handle
        self.name = name

    @property
    def handle(self) -> int | None:
        return self._handle

    def pin(self, path: str) -> None:
        ok = _libbpf().bpf_link__pin(self._handle, path.encode()) == 0
        _check(f"pin {self.name} at {path}", ok)

    @classmethod
    def open(cls, path: str) -> Link:
        """A link pinned at ``path`` (by this or an earlier process)."""
        handle = _libbpf().bpf_link__open(path.encode())
        _check(f"open the link pinned at {path}", bool(handle))
        return cls(handle, os.path.basename(path))

    def destroy(self) -> None:
        if self._handle is not None:
            _libbpf().bpf_link__destroy(self._handle)
            self._handle = None


class BpfObject:
    """A compiled BPF object file, loaded into the kernel: its programs and maps."""

    def __init__(self, path: str, pins: dict[str, str] | None = None) -> None:
        """Open and load ``path``. ``pins``: map name -> bpffs path; a map already pinned
        there is reused (its entries kept), else it is created and pinned."""
        lib = _libbpf()
        self.log: list[str] = []
        self._printer = _PRINT(self._print)  # held: libbpf calls it while loading
        lib.libbpf_set_print(ctypes.cast(self._printer, ctypes.c_void_p))
        handle = lib.bpf_object__open_file(path.encode(), None)
        _check(f"open {path}", bool(handle))
        self._handle: int | None = handle
        try:
            for name, pin in (pins or {}).items():
                m = lib.bpf_object__find_map_by_name(handle, name.encode())
                _check(f"map {name} in {path}", bool(m))
                _check(f"pin path of {name}", lib.bpf_map__set_pin_path(m, pin.encode()) == 0)
            if lib.bpf_object__load(handle) != 0:
                err = ctypes.get_errno()
                detail = "; ".join(line for line in self.log[-3:] if line)
                raise BpfError(err, f"load {path}: {os.strerror(err)}: {detail}")
        except BpfError:
            self.close()
            raise

    def _print(self, level: int, fmt: bytes | None, args: int | None) -> int:
        """libbpf's messages (the verifier's log among them), formatted by the C library:
        the arguments arrive as a va_list."""
        if fmt:
            buf = ctypes.create_string_buffer(1024)
            _libc.vsnprintf(buf, len(buf), fmt, args)
            self.log.append(buf.value.decode(errors="replace").rstrip())
        return 0

    def program_fd(self, name: str) -> int:
        prog = _libbpf().bpf_object__find_program_by_name(self._handle, name.encode())
        _check(f"program {name}", bool(prog))
        return int(_libbpf().bpf_program__fd(prog))

    def map(self, name: str) -> Map:
        """The map ``name``, on a descriptor of its own (it outlives this object)."""
        m = _libbpf().bpf_object__find_map_by_name(self._handle, name.encode())
        _check(f"map {name}", bool(m))
        fd = os.dup(_libbpf().bpf_map__fd(m))
        info = map_info(fd)
        return Map(fd, info.key_size, info.value_size, info.max_entries)

    def attach_cgroup(self, program: str, cgroup: str) -> Link:
        """Attach ``program`` to the cgroup v2 directory ``cgroup`` through a bpf_link."""
        lib = _libbpf()
        prog = lib.bpf_object__find_program_by_name(self._handle, program.encode())
        _check(f"program {program}", bool(prog))
        fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            link = lib.bpf_program__attach_cgroup(prog, fd)
            _check(f"attach {program} to {cgroup}", bool(link))
        finally:
            os.close(fd)
        return Link(link, program)

    def update_link(self, link: Link, program: str) -> None:
        """Swap the program behind an attached ``link`` for this object's ``program``, in one
        step: no connection finds the hook empty (a restart, an upgrade)."""
        lib = _libbpf()
        prog = lib.bpf_object__find_program_by_name(self._handle, program.encode())
        _check(f"program {program}", bool(prog))
        _check(
            f"update {link.name} to {program}", lib.bpf_link__update_program(link.handle, prog) == 0
        )

    def close(self) -> None:
        """Unload what nothing else holds: attached or pinned programs and maps stay."""
        if self._handle is not None:
            _libbpf().bpf_object__close(self._handle)
            self._handle = None

    def __enter__(self) -> BpfObject:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
