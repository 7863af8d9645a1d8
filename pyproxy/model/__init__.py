"""The proxy's value objects, their conversion from API objects, and endpoint selection.

Depends on nothing else in pyproxy (enforced by import-linter in ``make lint``).
"""

from pyproxy.model.events import Event, EventType
from pyproxy.model.selection import EndpointSelection, categorize_endpoints
from pyproxy.model.types import (
    Endpoint,
    IPAddress,
    IPFamily,
    IPNetwork,
    NamespacedName,
    NodeInfo,
    Protocol,
    ProxyState,
    ServicePort,
    ServicePortName,
)

__all__ = [
    "Endpoint",
    "EndpointSelection",
    "Event",
    "EventType",
    "IPAddress",
    "IPFamily",
    "IPNetwork",
    "NamespacedName",
    "NodeInfo",
    "Protocol",
    "ProxyState",
    "ServicePort",
    "ServicePortName",
    "categorize_endpoints",
]
