"""A mode is one declaration: a test registers a mode of its own (a backend that records what
it is asked to program) and the configuration, the command line, the daemon and the tools take
it like pyproxy's own, with no other file changed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pyproxy.backends import registry
from pyproxy.backends.base import Backend, SyncRequest, SyncResult
from pyproxy.backends.mode import Mode
from pyproxy.cli.commands import cli
from pyproxy.cli.daemon import Daemon
from pyproxy.config.load import Setting, choice
from pyproxy.config.settings import ProxyConfig
from pyproxy.model.events import KINDS, Event, EventType
from pyproxy.model.types import ProxyState
from tests.helpers import endpoint, endpoint_slice, load_config, port, service

SYNCED: list[SyncRequest] = []


class Recording(Backend):
    mode = "recording"

    def __init__(self, cfg: ProxyConfig) -> None:
        self.flavour = str(cfg.option("recording_flavour", "plain"))

    def sync(self, request: SyncRequest) -> SyncResult:
        SYNCED.append(request)
        return SyncResult(full=request.full)

    def render(self, state: ProxyState) -> str:
        return "".join(f"{self.flavour} {spn}\n" for spn in sorted(state.services, key=str))

    def cleanup(self) -> None:
        pass


def _counters(cfg: ProxyConfig) -> tuple[str, Any, str]:
    return "recording", {"syncs": len(SYNCED)}, f"recorded {len(SYNCED)} syncs\n"


RECORDING = Mode(
    "recording",
    Recording,
    settings=(Setting("recording_flavour", "--recording-flavour", "recording.flavour", "plain",
                      choice("plain", "salted"), "How to record.", ("plain", "salted")),),
    counters=_counters,
)  # fmt: skip


@pytest.fixture
def recording() -> Iterator[Mode]:
    registry.register(RECORDING)
    SYNCED.clear()
    try:
        yield RECORDING
    finally:
        registry.MODES.pop(RECORDING.name)


def test_the_configuration_takes_the_mode_and_its_own_settings(
    recording: Mode, tmp_path: Path
) -> None:
    cfg = load_config({"hostname_override": "n", "mode": "recording"})
    assert cfg.mode == "recording" and cfg.option("recording_flavour") == "plain"
    path = tmp_path / "config.yaml"
    path.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
        "mode: recording\nrecording: {syncPeriod: 7s, flavour: salted}\n"
    )
    cfg = load_config({"hostname_override": "n"}, str(path))
    assert cfg.sync_period == 7.0 and cfg.option("recording_flavour") == "salted"
    assert isinstance(registry.create(cfg), Recording)


def test_the_command_line_renders_and_reports_in_the_mode(recording: Mode, tmp_path: Path) -> None:
    import yaml

    objs = [
        service("ns", "web", "10.96.0.1", [port("http", 80)]),
        endpoint_slice("ns", "web", "web-1", [endpoint("10.1.0.1")], [port("http", 8080)]),
    ]
    (tmp_path / "objects.yaml").write_text(yaml.safe_dump_all(objs))
    runner = CliRunner()
    res = runner.invoke(cli, ["render", "--mode=recording", "--manifests", str(tmp_path),
                              "--node", "n"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert res.output == "plain ns/web:http\n"
    res = runner.invoke(cli, ["status", "--mode=recording"])
    assert res.exit_code == 0 and res.output == "recorded 0 syncs\n"


def test_the_daemon_syncs_through_the_mode(recording: Mode) -> None:
    cfg = load_config({"hostname_override": "n", "mode": "recording",
                       "metrics_bind_address": "", "healthz_bind_address": ""})  # fmt: skip
    daemon = Daemon(cfg)
    for kind in KINDS:
        daemon.tracker.apply(Event(kind, EventType.SYNCED))
    assert daemon.syncer.sync()
    assert [r.full for r in SYNCED] == [True] and daemon.status()["mode"] == "recording"
