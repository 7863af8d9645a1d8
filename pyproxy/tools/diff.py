"""``pyproxy diff``: the differences a backend found between the kernel and what pyproxy would
program now, grouped by service, as text or JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence

from pyproxy.backends.base import Difference, differences_doc


def report(diffs: Sequence[Difference], output: str = "text") -> str:
    if output == "json":
        return json.dumps(differences_doc(diffs), indent=1) + "\n"
    if not diffs:
        return "no differences: the kernel holds what pyproxy would program\n"
    out: list[str] = []
    groups: dict[str, list[Difference]] = {}
    for d in diffs:
        groups.setdefault(d.service, []).append(d)
    for service in sorted(groups, key=lambda s: (s == "", s)):
        out.append(f"service {service}:" if service else "node-wide objects:")
        for d in groups[service]:
            out.append(f"  {d.obj}")
            out += [f"    - {line}" for line in d.missing]
            out += [f"    + {line}" for line in d.unexpected]
    out.append(f"{len(diffs)} difference(s); '-' expected and missing, '+' present and not "
               "expected")  # fmt: skip
    return "\n".join(out) + "\n"
