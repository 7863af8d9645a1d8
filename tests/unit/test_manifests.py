"""The manifests source sees files being added, edited and deleted."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from pyproxy.model.events import Event, EventType
from pyproxy.sources.manifests import ManifestsSource
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
    assert replaces == {"Service": 1, "EndpointSlice": 1, "Node": 0}
    assert sum(e.type is EventType.SYNCED for e in events) == 3

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
