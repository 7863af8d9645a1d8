"""Manifests source: Service, EndpointSlice and Node objects from YAML files in a directory.

The directory is polled (every ``interval`` seconds, comparing mtime and size), which works
on every filesystem and in every container without inotify. A file that fails to parse keeps
its previous objects, so saving a half-written file never drops rules; the error is logged
once per change of the file.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from pyproxy.model.events import KINDS, Event, EventType

log = logging.getLogger(__name__)

ObjKey = tuple[str, str, str]  # kind, namespace, name
SUFFIXES = (".yaml", ".yml", ".json")


class ManifestError(ValueError):
    pass


def _documents(path: Path) -> Iterator[Any]:
    text = path.read_text()
    if path.suffix == ".json":
        yield json.loads(text)
    else:
        yield from yaml.safe_load_all(text)


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
            ns = "" if kind == "Node" else str(meta.get("namespace") or "default")
            obj = dict(obj)
            obj["metadata"] = {**meta, "namespace": ns} if ns else dict(meta)
            out[(str(kind), ns, str(meta["name"]))] = obj
    return out


class ManifestsSource:
    def __init__(
        self, directory: Path, sink: Callable[[Event], object], interval: float = 0.5
    ) -> None:
        if not directory.is_dir():
            raise ManifestError(f"{directory} is not a readable directory")
        self.directory = directory
        self.sink = sink
        self.interval = interval
        self._stamps: dict[Path, tuple[int, int]] = {}
        self._per_file: dict[Path, dict[ObjKey, Mapping[str, Any]]] = {}
        self._current: dict[ObjKey, Mapping[str, Any]] = {}
        self.scans = 0

    def _files(self) -> list[Path]:
        return sorted(
            p
            for p in self.directory.iterdir()
            if p.is_file() and p.suffix in SUFFIXES and not p.name.startswith(".")
        )

    def _rescan(self) -> bool:
        """Re-read changed files; True if any file changed."""
        self.scans += 1
        try:
            files = self._files()
        except OSError as err:
            log.error("cannot list %s: %s", self.directory, err)
            return False
        changed = False
        for gone in set(self._stamps) - set(files):
            del self._stamps[gone]
            self._per_file.pop(gone, None)
            changed = True
        for path in files:
            try:
                st = path.stat()
            except OSError:
                continue
            stamp = (st.st_mtime_ns, st.st_size)
            if self._stamps.get(path) == stamp:
                continue
            self._stamps[path] = stamp
            changed = True
            try:
                self._per_file[path] = parse_file(path)
            except ManifestError as err:
                log.error("manifest skipped, keeping its previous objects: %s", err)
        return changed

    def _merged(self) -> dict[ObjKey, Mapping[str, Any]]:
        merged: dict[ObjKey, Mapping[str, Any]] = {}
        for path in sorted(self._per_file):
            for key, obj in self._per_file[path].items():
                if key in merged:
                    log.warning("%s %s/%s is defined twice; %s wins", key[0], key[1], key[2], path)
                merged[key] = obj
        return merged

    def initial(self) -> None:
        """Emit the complete initial state (REPLACE + SYNCED for every kind)."""
        self._rescan()
        self._current = self._merged()
        for kind in KINDS:
            objs = [o for k, o in self._current.items() if k[0] == kind]
            self.sink(Event(kind, EventType.REPLACE, objects=objs))
            self.sink(Event(kind, EventType.SYNCED))

    def poll(self) -> int:
        """Check the directory once; emit events for what changed. Returns the event count."""
        if not self._rescan():
            return 0
        new = self._merged()
        events = 0
        for key in sorted(set(self._current) | set(new)):
            before, after = self._current.get(key), new.get(key)
            if before == after:
                continue
            if after is None:
                assert before is not None
                self.sink(Event(key[0], EventType.DELETED, before))
            else:
                kind = EventType.ADDED if before is None else EventType.MODIFIED
                self.sink(Event(key[0], kind, after))
            events += 1
        self._current = new
        return events

    def run(self, stop: threading.Event) -> None:
        self.initial()
        while not stop.wait(self.interval):
            try:
                self.poll()
            except Exception:  # a source must never die on one bad scan
                log.exception("manifests scan failed")
