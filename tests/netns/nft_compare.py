"""Compare nftables tables the way the kernel holds them: ``nft list table`` output parsed into
objects, with what carries no meaning normalized away (element order, handles, counters)."""

from __future__ import annotations

import re
from typing import Any

from tests.netns.world import World, sh

OBJECT = re.compile(r"^\t(chain|set|map) (\S+) \{$")
COUNTER = re.compile(r" counter packets \d+ bytes \d+")
HANDLE = re.compile(r" # handle \d+$")


def _split_elements(body: str) -> list[str]:
    """Top-level comma-separated items of an ``elements = { ... }`` body."""
    out, depth, cur = [], 0, []
    for ch in body:
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def canonical(text: str) -> dict[str, Any]:
    """{"chain NAME": [rules in order], "set NAME": {"props": [...], "elements": [sorted]}}"""
    out: dict[str, Any] = {}
    current: str | None = None
    body: list[str] = []
    for raw in text.splitlines():
        if m := OBJECT.match(raw):
            current, body = f"{m.group(1)} {m.group(2)}", []
        elif raw == "\t}" and current is not None:
            out[current] = _object(current, body)
            current = None
        elif current is not None:
            body.append(HANDLE.sub("", COUNTER.sub("", raw.strip())))
    return out


def _object(name: str, body: list[str]) -> Any:
    lines = [ln for ln in body if ln]
    if name.startswith("chain "):
        return lines
    joined = " ".join(lines)
    elements: list[str] = []
    if "elements = {" in joined:
        head, rest = joined.split("elements = {", 1)
        elements = sorted(_split_elements(rest.rsplit("}", 1)[0]))
        joined = head
    return {"props": joined.split(), "elements": elements}


def table(world: World, ns: str, family: str = "ip") -> dict[str, Any]:
    res = world.exec(ns, "nft", "list", "table", family, "kube-proxy", check=False)
    return canonical(res.stdout) if res.returncode == 0 else {}


def load_in_scratch_namespace(world: World, text: str, family: str = "ip") -> dict[str, Any]:
    ns = f"pp{world.tag}-nftscratch"
    sh("ip", "netns", "add", ns)
    world.namespaces.append(ns)
    try:
        world.exec(ns, "nft", "-f", "-", input=text)
        return table(world, ns, family)
    finally:
        sh("ip", "netns", "del", ns, check=False)
        world.namespaces.remove(ns)
