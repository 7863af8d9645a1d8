"""``pyproxy_service_{connections,packets,bytes}_total``: per service port, what the mode's
objects counted (``Backend.service_traffic``), read at each scrape. Off by default
(``--service-metrics``): reading every counter costs a kernel dump per scrape, and a series
per service port can be many. At most ``cap`` service ports are exported, the first in name
order (stable, so a series does not come and go as traffic shifts); how many were left out is
``pyproxy_service_metrics_omitted_ports``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from pyproxy.backends.base import BackendError, ServiceTraffic

log = logging.getLogger(__name__)
LABELS = ("namespace", "service", "port")


def labels(service_port: str) -> tuple[str, str, str]:
    """``ns/name:port`` (``ns/name`` for an unnamed port) -> the three label values."""
    namespace, _, rest = service_port.partition("/")
    name, _, port = rest.partition(":")
    return namespace, name, port


class ServiceTrafficCollector(Collector):
    def __init__(self, read: Callable[[], Mapping[str, ServiceTraffic]], cap: int) -> None:
        self.read = read
        self.cap = cap

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        conns = CounterMetricFamily(
            "pyproxy_service_connections",
            "Connections (UDP: flows) to the service port, as the proxy mode counts them",
            labels=LABELS,
        )
        packets = CounterMetricFamily(
            "pyproxy_service_packets",
            "Packets the proxy mode counted for the service port (iptables and nftables: the "
            "first packet of each connection; IPVS: all, both directions)",
            labels=LABELS,
        )
        octets = CounterMetricFamily(
            "pyproxy_service_bytes",
            "Bytes the proxy mode counted for the service port (iptables and nftables: of "
            "first packets; IPVS: all, both directions; userspace: payload relayed)",
            labels=LABELS,
        )
        omitted = GaugeMetricFamily(
            "pyproxy_service_metrics_omitted_ports",
            "Service ports left out of pyproxy_service_* (over --service-metrics-max-series)",
        )
        try:
            seen = self.read()
        except (BackendError, RuntimeError) as err:  # RuntimeError: a sync changed the table
            log.warning("per-service metrics not read this time: %s", err)
            seen = {}
        names = sorted(seen)
        for name in names[: self.cap]:
            t = seen[name]
            values = labels(name)
            conns.add_metric(values, t.connections)
            if t.packets is not None:
                packets.add_metric(values, t.packets)
            if t.bytes is not None:
                octets.add_metric(values, t.bytes)
        omitted.add_metric((), max(0, len(names) - self.cap))
        yield from (conns, packets, octets, omitted)
