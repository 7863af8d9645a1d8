"""The manifests source sees files being added, edited and deleted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from pyproxy.model.events import Event, EventType
from pyproxy.sources.manifests import ManifestsSource, filesystem_type
from tests.helpers import endpoint, endpoint_slice, port, service


def write(path: Path, *docs: dict) -> None:
    path.write_text(yaml.safe_dump_all(docs))
    st = path.stat()  # make sure the change is visible even within one mtime tick
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_initial_add_edit_delete(tmp_path: Path) -> None:
    events: list[Event] = []
    a = tmp_path / "a.yaml"
    write(
        a,
        service("ns", "web", "10.96.0.1", [port("p", 80)]),
        endpoint_slice("ns", "web", "web-1", [endpoint("10.1.0.1")], [port("p", 80)]),
    )
    src = ManifestsSource(tmp_path, events.append)
    src.initial()
    replaces = {e.kind: len(e.objects) for e in events if e.type is EventType.REPLACE}
    assert replaces == {"Service": 1, "EndpointSlice": 1, "Node": 0, "ServiceCIDR": 0}
    assert sum(e.type is EventType.SYNCED for e in events) == 4

    events.clear()
    assert src.poll() == 0
    write(tmp_path / "b.yml", service("ns", "db", "10.96.0.2", [port("p", 5432)]))
    src.poll()
    assert [(e.kind, e.type, e.obj["metadata"]["name"]) for e in events] == [
        ("Service", EventType.ADDED, "db")
    ]

    events.clear()
    write(a, service("ns", "web", "10.96.0.1", [port("p", 81)]))
    src.poll()
    assert sorted((e.type, e.obj["metadata"]["name"]) for e in events) == [
        (EventType.DELETED, "web-1"),
        (EventType.MODIFIED, "web"),
    ]

    events.clear()
    (tmp_path / "b.yml").unlink()
    src.poll()
    assert [(e.type, e.obj["metadata"]["name"]) for e in events] == [(EventType.DELETED, "db")]


def test_broken_file_keeps_previous_objects(tmp_path: Path) -> None:
    events: list[Event] = []
    a = tmp_path / "a.yaml"
    write(a, service("ns", "web", "10.96.0.1", [port("p", 80)]))
    src = ManifestsSource(tmp_path, events.append)
    src.initial()
    events.clear()
    a.write_text("kind: Service\nmetadata: {name: [unclosed\n")
    src.poll()
    assert events == []  # nothing deleted


def test_list_kind_and_default_namespace(tmp_path: Path) -> None:
    events: list[Event] = []
    svc = service("ns", "web", "10.96.0.1", [port("p", 80)])
    del svc["metadata"]["namespace"]
    write(tmp_path / "l.yaml", {"kind": "List", "items": [svc]})
    ManifestsSource(tmp_path, events.append).initial()
    (objs,) = [e.objects for e in events if e.kind == "Service" and e.type is EventType.REPLACE]
    assert objs[0]["metadata"]["namespace"] == "default"


def test_inotify_delivers_changes_and_rereads_only_the_changed_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from pyproxy.sources import manifests

    for i in range(20):
        write(tmp_path / f"s{i}.yaml", service("ns", f"s{i}", f"10.96.0.{i + 1}", [port("p", 80)]))
    parsed: list[Path] = []
    real = manifests.parse_file
    monkeypatch.setattr(manifests, "parse_file", lambda p: parsed.append(p) or real(p))
    events: list[Event] = []
    got = threading.Event()
    src = ManifestsSource(tmp_path, lambda e: (events.append(e), got.set()))
    stop = threading.Event()
    thread = threading.Thread(target=src.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert got.wait(10) and len(parsed) == 20  # the initial read
        got.clear()
        events.clear()
        parsed.clear()
        tmp = tmp_path / ".s3.tmp"  # written aside and renamed, as editors and tools do
        tmp.write_text(yaml.safe_dump(service("ns", "s3", "10.96.0.4", [port("p", 81)])))
        tmp.replace(tmp_path / "s3.yaml")
        assert got.wait(10), "no event within 10 s"
        assert src.watching and src.scans == 1  # inotify, no directory scan
        assert [(e.type, e.obj["metadata"]["name"]) for e in events] == [(EventType.MODIFIED, "s3")]
        assert parsed == [tmp_path / "s3.yaml"]
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()


def test_the_same_object_in_two_files_the_last_file_wins(tmp_path: Path) -> None:
    events: list[Event] = []
    write(tmp_path / "a.yaml", service("ns", "web", "10.96.0.1", [port("p", 80)]))
    write(tmp_path / "b.yaml", service("ns", "web", "10.96.0.1", [port("p", 90)]))
    src = ManifestsSource(tmp_path, events.append)
    src.initial()
    (objs,) = [e.objects for e in events if e.kind == "Service" and e.type is EventType.REPLACE]
    assert objs[0]["spec"]["ports"][0]["port"] == 90
    events.clear()
    (tmp_path / "b.yaml").unlink()
    src.poll()
    assert [(e.type, e.obj["spec"]["ports"][0]["port"]) for e in events] == [
        (EventType.MODIFIED, 80)
    ]


MOUNTINFO = """\
22 1 0:20 / / rw,relatime - hostfs none rw
23 22 0:5 / /proc rw - proc proc rw
24 22 0:21 / /run rw - tmpfs tmpfs rw
25 22 0:44 / /srv/shared\\040dir rw - nfs4 server:/export rw
26 22 8:1 / /srv/shared\\040dir/local rw - ext4 /dev/sda1 rw
"""


def test_filesystem_type_is_the_longest_mount_prefix() -> None:
    """Where inotify misses writes (user-mode Linux's hostfs root, NFS), the source polls."""
    assert filesystem_type(Path("/tmp/manifests"), MOUNTINFO) == "hostfs"
    assert filesystem_type(Path("/run/m"), MOUNTINFO) == "tmpfs"
    assert filesystem_type(Path("/srv/shared dir/x"), MOUNTINFO) == "nfs4"
    assert filesystem_type(Path("/srv/shared dir/local/x"), MOUNTINFO) == "ext4"
    assert filesystem_type(Path("/srv/shared"), MOUNTINFO) == "hostfs"  # a prefix, not a mount


def test_a_same_size_replacement_in_the_same_mtime_tick_is_seen(tmp_path: Path) -> None:
    """Where mtimes are coarse (hostfs, some NFS), a file replaced by rename with the same
    size and the same mtime must still count as changed: its inode differs."""
    events: list[Event] = []
    a = tmp_path / "a.yaml"
    docs = [endpoint_slice("ns", "web", "web-1", [endpoint("10.1.0.1", node="node-a")],
                           [port("p", 80)])]  # fmt: skip
    a.write_text(yaml.safe_dump_all(docs))
    before = a.stat()
    src = ManifestsSource(tmp_path, events.append)
    src.initial()
    events.clear()
    tmp = tmp_path / ".a.tmp"
    docs[0]["endpoints"][0]["nodeName"] = "node-b"  # same length
    tmp.write_text(yaml.safe_dump_all(docs))
    os.utime(tmp, ns=(before.st_atime_ns, before.st_mtime_ns))
    tmp.replace(a)
    assert a.stat().st_size == before.st_size and a.stat().st_mtime_ns == before.st_mtime_ns
    assert src.poll() == 1
    assert events[0].type is EventType.MODIFIED
