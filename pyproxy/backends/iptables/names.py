"""Chain names, bit-for-bit as upstream (pkg/proxy/iptables/proxier.go ``portProtoHash``):
sha256 of the service-port name plus lowercase protocol (plus "ip:port" for endpoints),
base32 (RFC 4648), first 16 characters, so names fit iptables' 28-character limit."""

from __future__ import annotations

import base64
import hashlib

from pyproxy.model.types import Endpoint, ServicePortName

SVC = "KUBE-SVC-"
SVL = "KUBE-SVL-"
EXT = "KUBE-EXT-"
FW = "KUBE-FW-"
SEP = "KUBE-SEP-"
SERVICE_CHAIN_PREFIXES = (SVC, SVL, EXT, FW, SEP)


def _hash(text: str) -> str:
    # 16 base32 characters encode exactly the digest's first 10 bytes.
    return base64.b32encode(hashlib.sha256(text.encode()).digest()[:10]).decode()


def port_proto_hash(spn: ServicePortName) -> str:
    return _hash(str(spn) + spn.protocol.value.lower())


def cluster_chain(spn: ServicePortName) -> str:
    return SVC + port_proto_hash(spn)


def local_chain(spn: ServicePortName) -> str:
    return SVL + port_proto_hash(spn)


def external_chain(spn: ServicePortName) -> str:
    return EXT + port_proto_hash(spn)


def firewall_chain(spn: ServicePortName) -> str:
    return FW + port_proto_hash(spn)


def endpoint_chain(spn: ServicePortName, ep: Endpoint) -> str:
    return SEP + _hash(str(spn) + spn.protocol.value.lower() + str(ep))


def is_service_chain(name: str) -> bool:
    return name.startswith(SERVICE_CHAIN_PREFIXES)
