"""Flags and a KubeProxyConfiguration file -> one validated ``ProxyConfig``.

One table (``SETTINGS``, plus the settings each mode declares for itself) names every
setting once: its flag, its field in the file (kubeproxy.config.k8s.io/v1alpha1; sync periods
and masquerade settings are read from the section the chosen mode names, as upstream converts
them), its default and its parser. The modes come from the caller (``ModeSettings``): this
module knows none by name. Defaults < file < flags given on the command line. A field
pyproxy does not know is named in a warning; a bad value is one ``ConfigError`` line naming
the flag or the file's field.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from pyproxy.config.settings import (
    IPTABLES_BACKENDS,
    LOG_FORMATS,
    LOG_LEVELS,
    Conntrack,
    DetectLocalMode,
    Masquerade,
    ProxyConfig,
    Source,
)
from pyproxy.model.nodeports import NodePortAddresses
from pyproxy.model.types import IPNetwork

log = logging.getLogger(__name__)

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
API_VERSION = "kubeproxy.config.k8s.io/v1alpha1"
KIND = "KubeProxyConfiguration"


class ConfigError(ValueError):
    """A bad setting; the message is one line naming the flag or file field."""


# ---- value parsers: raw (flag text, flag value or YAML value) -> typed, or ValueError -------


def duration(value: Any) -> float:
    """Go-style durations ("1s", "500ms", "1m30s") or plain seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        text = str(value).strip()
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise ValueError(f"invalid duration {value!r} (e.g. 1s, 500ms, 1m)") from None
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds < 0:
        raise ValueError(f"duration {value!r} must not be negative")
    return seconds


def _items(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    return str(value).split(",")


def cidrs(value: Any) -> tuple[IPNetwork, ...]:
    out = []
    for part in (p.strip() for p in _items(value)):
        if not part:
            continue
        try:
            out.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ValueError(f"{part!r} is not a CIDR") from None
    if len({n.version for n in out}) != len(out):
        raise ValueError("give at most one CIDR per IP family")
    return tuple(out)


def bind_address(value: Any) -> tuple[str, int] | None:
    """host:port, [v6]:port, or empty to disable."""
    text = str(value or "").strip()
    if not text:
        return None
    m = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(\d+)|([^:\[\]]*):(\d+)", text)
    if not m:
        raise ValueError(f"{text!r} is not host:port")
    host = m.group(1) or m.group(3) or "0.0.0.0"
    port = int(m.group(2) or m.group(4))
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} is out of range")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{host!r} is not an IP address") from None
    return host, port


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError(f"{value!r} is not true or false")


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{value!r} is not an integer")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an integer") from None


def masquerade_bit(value: Any) -> int:
    bit = _integer(value)
    if not 0 <= bit <= 31:
        raise ValueError("must be within 0-31")
    return bit


def non_negative(value: Any) -> int:
    n = _integer(value)
    if n < 0:
        raise ValueError("must not be negative")
    return n


def series_cap(value: Any) -> int:
    cap = _integer(value)
    if cap < 1:
        raise ValueError("must be at least 1")
    return cap


def choice(*allowed: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if str(value) not in allowed:
            raise ValueError(f"{value!r} is not one of {', '.join(allowed)}")
        return str(value)

    return parse


def text(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def raw_text(value: Any) -> str | None:
    """Like ``text`` but keeps an empty string, which some settings reject."""
    return None if value is None else str(value)


def nodeport_addresses(value: Any) -> NodePortAddresses | None:
    """None when unset (the default then depends on the mode)."""
    items = [i for i in _items(value) if i.strip()]
    return NodePortAddresses.parse(items) if items else None


def detect_local_mode(value: Any) -> DetectLocalMode:
    try:
        return DetectLocalMode(str(value))
    except ValueError:
        modes = ", ".join(m.value for m in DetectLocalMode)
        raise ValueError(f"{value!r} is not one of {modes}") from None


# ---- the settings table ---------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    name: str
    """The click parameter name and the key of the merged values."""
    flag: str
    field: str | Callable[[ModeSettings], str] | None
    """Path in the file (dots for nesting), or a function of the mode; None: flag only."""
    default: Any
    parse: Callable[[Any], Any]
    help: str = ""
    """For the command line (a mode's own settings become options from this)."""
    choices: tuple[str, ...] = ()

    def field_for(self, mode: ModeSettings) -> str | None:
        return self.field(mode) if callable(self.field) else self.field


class ModeSettings(Protocol):
    """What the configuration needs to know of a mode (``pyproxy.backends.mode.Mode``)."""

    @property
    def name(self) -> str: ...

    @property
    def sync_section(self) -> str:
        """The file's section with this mode's minSyncPeriod and syncPeriod."""
        ...

    @property
    def masquerade_section(self) -> str:
        """The file's section with this mode's masqueradeAll and masqueradeBit."""
        ...

    @property
    def nodeport_default(self) -> NodePortAddresses:
        """--nodeport-addresses when unset (upstream's default differs per mode)."""
        ...

    @property
    def settings(self) -> tuple[Setting, ...]:
        """The mode's own settings (the values land in ``ProxyConfig.options``)."""
        ...


SETTINGS: tuple[Setting, ...] = (
    Setting("hostname_override", "--hostname-override", "hostnameOverride", None, raw_text),
    Setting("kubeconfig", "--kubeconfig", "clientConnection.kubeconfig", None, text),
    Setting("master", "--master", None, None, text),
    Setting("manifests", "--manifests", None, None, text),
    Setting("cluster_cidr", "--cluster-cidr", "clusterCIDR", "", cidrs),
    Setting(
        "detect_local_mode",
        "--detect-local-mode",
        "detectLocalMode",
        "ClusterCIDR",
        detect_local_mode,
    ),
    Setting(
        "masquerade_all",
        "--masquerade-all",
        lambda m: f"{m.masquerade_section}.masqueradeAll",
        False,
        boolean,
    ),
    Setting(
        "masquerade_bit",
        "--iptables-masquerade-bit",
        lambda m: f"{m.masquerade_section}.masqueradeBit",
        14,
        masquerade_bit,
    ),
    Setting(
        "nodeport_addresses",
        "--nodeport-addresses",
        "nodePortAddresses",
        None,
        nodeport_addresses,
    ),
    Setting(
        "localhost_nodeports",
        "--iptables-localhost-nodeports",
        "iptables.localhostNodePorts",
        True,
        boolean,
    ),
    Setting(
        "min_sync_period",
        "--min-sync-period",
        lambda m: f"{m.sync_section}.minSyncPeriod",
        "1s",
        duration,
    ),
    Setting(
        "sync_period",
        "--sync-period",
        lambda m: f"{m.sync_section}.syncPeriod",
        "30s",
        duration,
    ),
    Setting(
        "metrics_bind_address",
        "--metrics-bind-address",
        "metricsBindAddress",
        "127.0.0.1:10249",
        bind_address,
    ),
    Setting(
        "healthz_bind_address",
        "--healthz-bind-address",
        "healthzBindAddress",
        "0.0.0.0:10256",
        bind_address,
    ),
    Setting(
        "conntrack_max_per_core",
        "--conntrack-max-per-core",
        "conntrack.maxPerCore",
        32768,
        non_negative,
        "Conntrack entries per CPU (0: leave the table's size alone).",
    ),
    Setting("conntrack_min", "--conntrack-min", "conntrack.min", 131072, non_negative),
    Setting(
        "conntrack_tcp_timeout_established",
        "--conntrack-tcp-timeout-established",
        "conntrack.tcpEstablishedTimeout",
        "24h0m0s",
        duration,
    ),
    Setting(
        "conntrack_tcp_timeout_close_wait",
        "--conntrack-tcp-timeout-close-wait",
        "conntrack.tcpCloseWaitTimeout",
        "1h0m0s",
        duration,
    ),
    Setting(
        "conntrack_tcp_be_liberal",
        "--conntrack-tcp-be-liberal",
        "conntrack.tcpBeLiberal",
        False,
        boolean,
    ),
    Setting(
        "conntrack_udp_timeout", "--conntrack-udp-timeout", "conntrack.udpTimeout", "0s", duration
    ),
    Setting(
        "conntrack_udp_timeout_stream",
        "--conntrack-udp-timeout-stream",
        "conntrack.udpStreamTimeout",
        "0s",
        duration,
    ),
    Setting("iptables_backend", "--iptables-backend", None, "auto", choice(*IPTABLES_BACKENDS)),
    Setting("service_metrics", "--service-metrics", None, False, boolean),
    Setting("service_metrics_max_series", "--service-metrics-max-series", None, 1000, series_cap),
    Setting("log_level", "--log-level", None, "info", choice(*LOG_LEVELS)),
    Setting("log_format", "--log-format", None, "text", choice(*LOG_FORMATS)),
)
BY_NAME = {s.name: s for s in SETTINGS}
IGNORED_FIELDS = ("apiVersion", "kind")


def mode_setting(modes: Sequence[ModeSettings], default: str) -> Setting:
    """``--mode``: one of ``modes``."""
    names = tuple(m.name for m in modes)
    return Setting("mode", "--mode", "mode", default, choice(*names), "Proxy backend.", names)


def own_settings(modes: Sequence[ModeSettings]) -> tuple[Setting, ...]:
    """The settings the modes declare for themselves (one declared by two counts once)."""
    return tuple({s.name: s for m in modes for s in m.settings}.values())


def all_settings(modes: Sequence[ModeSettings], default: str) -> tuple[Setting, ...]:
    """Every setting: the mode first (the file's sections depend on it), the shared ones,
    then each mode's own."""
    return (mode_setting(modes, default), *SETTINGS, *own_settings(modes))


# ---- the file -------------------------------------------------------------------------------


def read_file(path: str, known: set[str]) -> dict[str, Any]:
    """The file's fields, flattened to dotted paths (a mapping whose path is one of the
    ``known`` fields stays whole)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        doc = yaml.load(Path(path).read_text(), Loader=loader)
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"--config: cannot read {path}: {str(err).splitlines()[0]}") from None
    if not isinstance(doc, Mapping):
        raise ConfigError(f"--config: {path} is not a {KIND} mapping")
    if doc.get("kind", KIND) != KIND:
        raise ConfigError(f"--config: {path} has kind {doc.get('kind')!r}, want {KIND}")
    return _flatten(doc, known)


def _known_fields(modes: Sequence[ModeSettings], default: str) -> set[str]:
    settings = all_settings(modes, default)
    return {f for s in settings for m in modes if (f := s.field_for(m)) is not None}


def _flatten(doc: Mapping[str, Any], known: set[str], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in doc.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and key not in known:
            out.update(_flatten(v, known, key + "."))
        else:
            out[key] = v
    return out


def _warn_unknown(path: str, fields: Mapping[str, Any], known: set[str]) -> None:
    for key, value in fields.items():
        if key in known or key in IGNORED_FIELDS or value in (None, "", [], {}, 0, False):
            continue
        log.warning("--config %s: field %s is not supported by pyproxy; ignored", path, key)


# ---- merge and validate ---------------------------------------------------------------------


def _pick(
    s: Setting,
    flags: Mapping[str, Any],
    fields: Mapping[str, Any],
    mode: ModeSettings,
    path: str | None,
) -> tuple[Any, str]:
    """(raw value, where it came from) by precedence: flag, file, default."""
    if s.name in flags:
        return flags[s.name], s.flag
    field = s.field_for(mode)
    if field is not None and fields.get(field) not in (None, ""):
        return fields[field], f"--config {path}: {field}"
    return s.default, s.flag


def load(
    flags: Mapping[str, Any],
    config_file: str | None,
    modes: Sequence[ModeSettings],
    default: str,
) -> ProxyConfig:
    """The configuration from the flags given on the command line (name -> value, only the
    ones the user set) over an optional file over the defaults; ``modes`` are the modes
    there are, ``default`` the mode without --mode."""
    fields: dict[str, Any] = {}
    if config_file:
        known = _known_fields(modes, default)
        fields = read_file(config_file, known)
        _warn_unknown(config_file, fields, known)
    by_name = {m.name: m for m in modes}
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    mode = by_name[default]
    for s in all_settings(modes, default):  # "mode" is first: the file's sections depend on it
        raw, origin = _pick(s, flags, fields, mode, config_file)
        try:
            values[s.name] = s.parse(raw)
        except ValueError as err:
            raise ConfigError(f"{origin}: {err}") from None
        origins[s.name] = origin
        if s.name == "mode":
            mode = by_name[values["mode"]]
    # Every mode's own settings, not only this mode's: a start removes what other modes left
    # (Mode.outlives), where their settings say it is.
    own = tuple((s.name, values[s.name]) for s in own_settings(modes))
    return _build(values, origins, mode, own)


def _build(
    v: Mapping[str, Any],
    origin: Mapping[str, str],
    mode: ModeSettings,
    options: tuple[tuple[str, Any], ...],
) -> ProxyConfig:
    if v["sync_period"] <= 0:
        raise ConfigError(f"{origin['sync_period']}: must be greater than 0")
    if v["min_sync_period"] > v["sync_period"]:
        raise ConfigError(f"{origin['min_sync_period']}: must not exceed the sync period")
    manifests = Path(v["manifests"]) if v["manifests"] else None
    if manifests is not None and not manifests.is_dir():
        raise ConfigError(f"--manifests: {manifests} is not a readable directory")
    if manifests is None and v["kubeconfig"] and not Path(v["kubeconfig"]).is_file():
        raise ConfigError(f"{origin['kubeconfig']}: {v['kubeconfig']} is not a readable file")
    npa = v["nodeport_addresses"]
    if npa is None:  # unset: upstream's per-mode default
        npa = mode.nodeport_default
    return ProxyConfig(
        mode=v["mode"],
        node_name=node_name(v["hostname_override"], origin["hostname_override"]),
        source=Source(manifests, v["kubeconfig"], v["master"]),
        cluster_cidrs=v["cluster_cidr"],
        detect_local_mode=v["detect_local_mode"],
        masquerade=Masquerade(v["masquerade_bit"], v["masquerade_all"]),
        nodeport_addresses=npa,
        localhost_nodeports=v["localhost_nodeports"],
        min_sync_period=v["min_sync_period"],
        sync_period=v["sync_period"],
        iptables_backend=v["iptables_backend"],
        options=options,
        metrics_address=v["metrics_bind_address"],
        healthz_address=v["healthz_bind_address"],
        service_metrics=v["service_metrics"],
        service_metrics_max_series=v["service_metrics_max_series"],
        log_level=v["log_level"],
        log_format=v["log_format"],
        conntrack=Conntrack(
            max_per_core=v["conntrack_max_per_core"],
            min=v["conntrack_min"],
            tcp_established_timeout=v["conntrack_tcp_timeout_established"],
            tcp_close_wait_timeout=v["conntrack_tcp_timeout_close_wait"],
            tcp_be_liberal=v["conntrack_tcp_be_liberal"],
            udp_timeout=v["conntrack_udp_timeout"],
            udp_stream_timeout=v["conntrack_udp_timeout_stream"],
        ),
    )


def node_name(override: str | None, origin: str = "--hostname-override") -> str:
    """Upstream trims and lowercases the override; without one, the host name."""
    if override is None:
        return socket.gethostname().lower()
    name = override.strip().lower()
    if not name:
        raise ConfigError(f"{origin}: must not be empty")
    return name


def default_document(modes: Sequence[ModeSettings], default: str) -> dict[str, Any]:
    """The defaults as a KubeProxyConfiguration (for --write-config-to), with the sections
    of the ``default`` mode and every mode's own settings."""
    mode = next(m for m in modes if m.name == default)
    doc: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND}
    for s in all_settings(modes, default):
        field = s.field_for(mode)
        if field is None:
            continue
        value = s.default
        if value is None:
            value = [] if s.name == "nodeport_addresses" else ""
        node = doc
        *parents, leaf = field.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return doc
