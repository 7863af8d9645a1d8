"""What a source hands the tracker: one event per object change, in API-server terms.

``REPLACE`` carries a kind's complete object list (an initial list or a relist after 410
Gone); the tracker turns objects missing from it into deletions. ``SYNCED`` says a kind's
initial state is complete, so the first sync does not program a half-known world.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

KINDS = ("Service", "EndpointSlice", "Node", "ServiceCIDR")


class EventType(StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    REPLACE = "REPLACE"
    SYNCED = "SYNCED"


@dataclass(frozen=True)
class Event:
    kind: str
    type: EventType
    obj: Mapping[str, Any] = field(default_factory=dict)
    objects: Sequence[Mapping[str, Any]] = ()
