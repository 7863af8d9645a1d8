"""Manifests source: Service, EndpointSlice and Node objects from YAML files in a directory.

Changes are learnt from inotify through ``watchdog``, whose watch is in place before the
first scan, so nothing written in between is missed; where inotify is unavailable (no free
inotify instance) or unreliable (network and host-shared filesystems, where it misses writes:
NFS, CIFS, 9p, virtiofs, FUSE, user-mode Linux's hostfs) the directory is polled instead,
comparing each file's inode, mtime and size. Either way only the files that changed
are read again (with libyaml's C loader when PyYAML has it), and only their objects are
compared, so a one-object edit costs one file, not the directory. A file that fails to parse
keeps its previous objects, so saving a half-written file never drops rules; the error is
logged once per change of the file. When two files define the same object, the file that
sorts last wins (with a warning).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

from pyproxy.model.events import KINDS, Event, EventType

log = logging.getLogger(__name__)

ObjKey = tuple[str, str, str]  # kind, namespace, name
SUFFIXES = (".yaml", ".yml", ".json")
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
QUIET_SECONDS = 0.02
"""How long the directory must be quiet before a batch of file changes is handled."""


class ManifestError(ValueError):
    pass


def _documents(path: Path) -> Iterator[Any]:
    text = path.read_text()
    if path.suffix == ".json":
        yield json.loads(text)
    else:
        yield from yaml.load_all(text, Loader=LOADER)


def _flatten(doc: Any) -> Iterator[Mapping[str, Any]]:
    if doc is None:
        return
    if not isinstance(doc, Mapping):
        raise ManifestError("a document is not a mapping")
    if doc.get("kind") == "List" or (doc.get("kind", "").endswith("List") and "items" in doc):
        for item in doc.get("items") or []:
            yield from _flatten(item)
    else:
        yield doc


def parse_file(path: Path) -> dict[ObjKey, Mapping[str, Any]]:
    """The proxy-relevant objects in one file; raises ManifestError naming the problem."""
    out: dict[ObjKey, Mapping[str, Any]] = {}
    try:
        docs = list(_documents(path))
    except (OSError, yaml.YAMLError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ManifestError(f"{path}: {str(err).splitlines()[0]}") from None
    for doc in docs:
        for obj in _flatten(doc):
            kind = obj.get("kind")
            if kind not in KINDS:
                continue
            meta = obj.get("metadata")
            if not isinstance(meta, Mapping) or not meta.get("name"):
                log.error("%s: a %s without metadata.name is skipped", path, kind)
                continue
            ns = "" if kind in ("Node", "ServiceCIDR") else str(meta.get("namespace") or "default")
            obj = dict(obj)
            obj["metadata"] = {**meta, "namespace": ns} if ns else dict(meta)
            out[(str(kind), ns, str(meta["name"]))] = obj
    return out


def _wanted(path: Path) -> bool:
    return path.suffix in SUFFIXES and not path.name.startswith(".")


class ManifestsSource:
    def __init__(
        self, directory: Path, sink: Callable[[Event], object], interval: float = 0.5
    ) -> None:
        if not directory.is_dir():
            raise ManifestError(f"{directory} is not a readable directory")
        self.directory = directory
        self.sink = sink
        self.interval = interval
        """Seconds between scans when polling (without inotify)."""
        self._stamps: dict[Path, tuple[int, int, int]] = {}
        self._per_file: dict[Path, dict[ObjKey, Mapping[str, Any]]] = {}
        self._files_of: dict[ObjKey, set[Path]] = {}
        self._current: dict[ObjKey, Mapping[str, Any]] = {}
        self.scans = 0
        self.watching = False
        """True while changes come from inotify rather than polling."""

    def _files(self) -> list[Path]:
        return sorted(p for p in self.directory.iterdir() if p.is_file() and _wanted(p))

    def _reread(self, path: Path) -> bool:
        """Parse ``path`` again if it changed; True when its objects may differ."""
        try:
            st = path.stat()
        except OSError:
            return self._forget(path)
        # The inode too: a file replaced by rename with the same size in the same second
        # looks unchanged by mtime alone where mtimes are coarse (hostfs, some NFS servers).
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._stamps.get(path) == stamp:
            return False
        self._stamps[path] = stamp
        try:
            objects = parse_file(path)
        except ManifestError as err:
            log.error("manifest skipped, keeping its previous objects: %s", err)
            return False
        self._set_file(path, objects)
        return True

    def _forget(self, path: Path) -> bool:
        self._stamps.pop(path, None)
        if path not in self._per_file:
            return False
        self._set_file(path, {})
        del self._per_file[path]
        return True

    def _set_file(self, path: Path, objects: dict[ObjKey, Mapping[str, Any]]) -> None:
        old = self._per_file.get(path, {})
        for key in old.keys() - objects.keys():
            self._files_of[key].discard(path)
        for key in objects.keys() - old.keys():
            self._files_of.setdefault(key, set()).add(path)
        self._per_file[path] = objects

    def _winner(self, key: ObjKey) -> Mapping[str, Any] | None:
        files = self._files_of.get(key)
        if not files:
            self._files_of.pop(key, None)
            return None
        if len(files) > 1:
            log.warning("%s %s/%s is defined in %d files; %s wins", *key, len(files), max(files))
        return self._per_file[max(files)][key]

    def initial(self) -> None:
        """Emit the complete initial state (REPLACE + SYNCED for every kind)."""
        self.scans += 1
        for path in self._files():
            self._reread(path)
        self._current = {k: v for k in self._files_of if (v := self._winner(k)) is not None}
        for kind in KINDS:
            objs = [o for k, o in self._current.items() if k[0] == kind]
            self.sink(Event(kind, EventType.REPLACE, objects=objs))
            self.sink(Event(kind, EventType.SYNCED))

    def refresh(self, paths: Iterable[Path]) -> int:
        """Read ``paths`` again (gone ones are forgotten); emit events for the objects that
        differ. Returns the event count."""
        affected: set[ObjKey] = set()
        for path in paths:
            had = set(self._per_file.get(path, {}))
            if self._reread(path) if path.exists() else self._forget(path):
                affected |= had | set(self._per_file.get(path, {}))
        events = 0
        # Services before their EndpointSlices, so no sync sees endpoints of an unknown service.
        for key in sorted(affected, key=lambda k: (KINDS.index(k[0]), k)):
            before, after = self._current.get(key), self._winner(key)
            if before == after:
                continue
            if after is None:
                assert before is not None
                del self._current[key]
                self.sink(Event(key[0], EventType.DELETED, before))
            else:
                self._current[key] = after
                kind = EventType.ADDED if before is None else EventType.MODIFIED
                self.sink(Event(key[0], kind, after))
            events += 1
        return events

    def poll(self) -> int:
        """One scan of the directory (the fallback without inotify)."""
        self.scans += 1
        try:
            files = set(self._files())
        except OSError as err:
            log.error("cannot list %s: %s", self.directory, err)
            return 0
        return self.refresh(sorted(files | set(self._stamps)))

    def run(self, stop: threading.Event) -> None:
        changes = _Changes()
        observer = self._observe(changes)
        self.initial()
        if observer is not None:
            self.watching = True
            try:
                while not stop.is_set():
                    paths = changes.wait(stop)
                    try:
                        self.refresh(sorted(paths))
                    except Exception:  # a source must never die on one bad batch
                        log.exception("manifests refresh failed")
            finally:
                self.watching = False
                observer.stop()
                observer.join(5)
            return
        while not stop.wait(self.interval):
            try:
                self.poll()
            except Exception:  # a source must never die on one bad scan
                log.exception("manifests scan failed")

    def _observe(self, changes: _Changes) -> BaseObserver | None:
        """An inotify watch on the directory, already in place when this returns."""
        try:
            fstype = filesystem_type(self.directory, Path("/proc/self/mountinfo").read_text())
        except OSError:
            fstype = ""
        if fstype in NO_INOTIFY or fstype.startswith("fuse"):
            log.info("%s is on %s, where inotify misses changes; polling every %ss",
                     self.directory, fstype, self.interval)  # fmt: skip
            return None
        try:
            observer = Observer()
            observer.schedule(changes, str(self.directory), recursive=False)
            observer.start()
        except Exception as err:  # no inotify here: poll instead
            log.warning("cannot watch %s with inotify (%s); polling every %ss",
                        self.directory, err, self.interval)  # fmt: skip
            return None
        return observer


NO_INOTIFY = frozenset({"nfs", "nfs4", "cifs", "smb3", "9p", "virtiofs", "hostfs", "vboxsf"})


def filesystem_type(directory: Path, mountinfo: str) -> str:
    """The type of the filesystem ``directory`` is on, from /proc/self/mountinfo's text (the
    mount point that is the longest prefix of its real path)."""
    path = os.path.realpath(directory)
    best, fstype = -1, ""
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, fstype = len(point), line.split(" - ", 1)[1].split()[0]
    return fstype


class _Changes(FileSystemEventHandler):
    """Paths inotify reported, collected until the directory has been quiet for a moment."""

    def __init__(self) -> None:
        self._paths: set[Path] = set()
        self._cond = threading.Condition()

    def on_any_event(self, event: FileSystemEvent) -> None:
        for raw in (event.src_path, getattr(event, "dest_path", "")):
            path = Path(os.fsdecode(raw)) if raw else None
            if path is not None and _wanted(path):
                with self._cond:
                    self._paths.add(path)
                    self._cond.notify_all()

    def wait(self, stop: threading.Event) -> set[Path]:
        """The next batch of changed paths (empty once ``stop`` is set)."""
        with self._cond:
            while not self._paths and not stop.is_set():
                self._cond.wait(0.5)
            while not stop.is_set():  # let a burst of writes settle
                count = len(self._paths)
                self._cond.wait(QUIET_SECONDS)
                if len(self._paths) == count:
                    break
            paths, self._paths = self._paths, set()
        return paths
