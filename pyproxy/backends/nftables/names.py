"""Object names, bit for bit as upstream (pkg/proxy/nftables/proxier.go ``hashAndTruncate``):
the first 8 base32 characters of sha256 of the readable name, a dash, then the readable name
("ns/svc/proto/port", plus "__IP/port" for endpoints, IPv6 colons as dots)."""

from __future__ import annotations

import base64
import hashlib

from pyproxy.model.types import Endpoint, ServicePortName

NAME_MAX = 256 - 16  # knftables.NameLengthMax minus the longest prefix
SERVICE = "service-"
LOCAL = "local-"
EXTERNAL = "external-"
FIREWALL = "firewall-"
ENDPOINT = "endpoint-"
AFFINITY = "affinity-"
COUNTER = "counter-"
"""pyproxy's own (not upstream's): a service port's named counter, with --service-metrics."""


def _hash_and_truncate(name: str) -> str:
    # 8 base32 characters encode exactly the digest's first 5 bytes.
    out = base64.b32encode(hashlib.sha256(name.encode()).digest()[:5]).decode() + "-" + name
    return out if len(out) <= NAME_MAX else out[: NAME_MAX - 3] + "..."


def port_base(spn: ServicePortName) -> str:
    s = spn.service
    return _hash_and_truncate(f"{s.namespace}/{s.name}/{spn.protocol.value.lower()}/{spn.port}")


def endpoint_base(spn: ServicePortName, ep: Endpoint) -> str:
    s = spn.service
    ip = str(ep.ip).replace(":", ".")
    name = f"{s.namespace}/{s.name}/{spn.protocol.value.lower()}/{spn.port}__{ip}/{ep.port}"
    return _hash_and_truncate(name)


def is_service_chain(name: str) -> bool:
    """Upstream recognises its per-service chains by the slash in their names."""
    return "/" in name


def is_affinity_set(name: str) -> bool:
    return name.startswith(AFFINITY)


def is_service_counter(name: str) -> bool:
    return name.startswith(COUNTER) and "/" in name


def counted_port(counter: str) -> str:
    """The service port a named counter counts, ``ns/name[:port]``, from its name alone
    (``counter-HASH-ns/name/proto/port``; a truncated name keeps what is left)."""
    readable = counter.removeprefix(COUNTER).split("-", 1)[-1]
    ns, name, _proto, port = [*readable.split("/", 3), "", "", ""][:4]
    return f"{ns}/{name}:{port}" if port else f"{ns}/{name}"
