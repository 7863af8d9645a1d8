"""Daemon options: parsing of flag values and of a KubeProxyConfiguration file.

Flag names and config fields follow kube-proxy (kubeproxy.config.k8s.io/v1alpha1) where
the concept is the same; values are validated here so a bad one fails with one line naming
the flag, before anything is started.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pyproxy.model.types import IPNetwork

log = logging.getLogger(__name__)

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class OptionError(ValueError):
    """A bad option value; the message names the flag."""


def parse_duration(flag: str, value: str | float | int) -> float:
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
                raise OptionError(
                    f"{flag}: invalid duration {value!r} (e.g. 1s, 500ms, 1m)"
                ) from None
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds < 0:
        raise OptionError(f"{flag}: duration {value!r} must not be negative")
    return seconds


def parse_cidrs(flag: str, value: str) -> tuple[IPNetwork, ...]:
    out = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            out.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise OptionError(f"{flag}: {part!r} is not a CIDR") from None
    if len({n.version for n in out}) != len(out):
        raise OptionError(f"{flag}: give at most one CIDR per IP family")
    return tuple(out)


def parse_nodeport_addresses(flag: str, value: str | list[str]) -> tuple[str, ...]:
    items = value if isinstance(value, list) else value.split(",")
    out = []
    for item in (str(i).strip() for i in items):
        if not item:
            continue
        if item in ("all", "primary", "localhost"):
            out.append(item)
            continue
        try:
            out.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise OptionError(
                f"{flag}: {item!r} is neither a CIDR nor one of all, primary, localhost"
            ) from None
    return tuple(out)


def parse_bind_address(flag: str, value: str) -> tuple[str, int] | None:
    """host:port, [v6]:port, or empty to disable."""
    value = value.strip()
    if not value:
        return None
    m = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(\d+)|([^:\[\]]*):(\d+)", value)
    if not m:
        raise OptionError(f"{flag}: {value!r} is not host:port")
    host = m.group(1) or m.group(3) or "0.0.0.0"
    port = int(m.group(2) or m.group(4))
    if not 0 <= port <= 65535:
        raise OptionError(f"{flag}: port {port} is out of range")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise OptionError(f"{flag}: {host!r} is not an IP address") from None
    return host, port


def node_name(override: str | None) -> str:
    name = (override or "").strip().lower()
    if override is not None and not name:
        raise OptionError("--hostname-override: must not be empty")
    return name or socket.gethostname().lower()


@dataclass
class Options:
    mode: str = "iptables"
    kubeconfig: str | None = None
    master: str | None = None
    manifests: str | None = None
    hostname_override: str | None = None
    cluster_cidr: str = ""
    masquerade_all: bool = False
    masquerade_bit: int = 14
    nodeport_addresses: str = ""
    localhost_nodeports: bool = True
    min_sync_period: str = "1s"
    sync_period: str = "30s"
    ipvs_scheduler: str = "rr"
    ipvs_strict_arp: bool = False
    metrics_bind_address: str = "127.0.0.1:10249"
    healthz_bind_address: str = "0.0.0.0:10256"
    iptables_backend: str = "auto"
    log_level: str = "info"
    log_format: str = "text"


# KubeProxyConfiguration field -> Options attribute (nested fields with dots).
CONFIG_FIELDS: Mapping[str, str] = {
    "mode": "mode",
    "clusterCIDR": "cluster_cidr",
    "hostnameOverride": "hostname_override",
    "healthzBindAddress": "healthz_bind_address",
    "metricsBindAddress": "metrics_bind_address",
    "nodePortAddresses": "nodeport_addresses",
    "clientConnection.kubeconfig": "kubeconfig",
    "iptables.masqueradeAll": "masquerade_all",
    "iptables.masqueradeBit": "masquerade_bit",
    "iptables.localhostNodePorts": "localhost_nodeports",
    "iptables.syncPeriod": "sync_period",
    "iptables.minSyncPeriod": "min_sync_period",
    "ipvs.scheduler": "ipvs_scheduler",
    "ipvs.strictARP": "ipvs_strict_arp",
    "syncPeriod": "sync_period",
    "minSyncPeriod": "min_sync_period",
}
IGNORED_FIELDS = ("apiVersion", "kind")


def _flatten(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in doc.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and key not in CONFIG_FIELDS:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def load_config_file(path: str) -> dict[str, Any]:
    """Options attributes set by a KubeProxyConfiguration file; warns about unknown fields."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise OptionError(f"--config: cannot read {path}: {str(err).splitlines()[0]}") from None
    if not isinstance(doc, Mapping):
        raise OptionError(f"--config: {path} is not a KubeProxyConfiguration mapping")
    if doc.get("kind", "KubeProxyConfiguration") != "KubeProxyConfiguration":
        raise OptionError(
            f"--config: {path} has kind {doc.get('kind')!r}, want KubeProxyConfiguration"
        )
    out: dict[str, Any] = {}
    for key, value in _flatten(doc).items():
        if key in IGNORED_FIELDS:
            continue
        attr = CONFIG_FIELDS.get(key)
        if attr is None:
            if value not in (None, "", [], {}, 0, False):
                log.warning("--config %s: field %s is not supported by pyproxy; ignored", path, key)
            continue
        if value is None or value == "":
            continue
        if attr == "nodeport_addresses" and isinstance(value, list):
            value = ",".join(str(v) for v in value)
        out[attr] = value
    return out


def default_config() -> dict[str, Any]:
    """The defaults as a KubeProxyConfiguration document (for --write-config-to)."""
    o = Options()
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": o.mode,
        "clusterCIDR": o.cluster_cidr,
        "hostnameOverride": "",
        "healthzBindAddress": o.healthz_bind_address,
        "metricsBindAddress": o.metrics_bind_address,
        "nodePortAddresses": [],
        "clientConnection": {"kubeconfig": ""},
        "iptables": {
            "masqueradeAll": o.masquerade_all,
            "masqueradeBit": o.masquerade_bit,
            "localhostNodePorts": o.localhost_nodeports,
            "syncPeriod": o.sync_period,
            "minSyncPeriod": o.min_sync_period,
        },
        "ipvs": {"scheduler": o.ipvs_scheduler},
    }
