"""A bounded client, run inside a client namespace: N TCP connects or UDP requests.

Prints one JSON object: {"replies": {pod: count}, "sources": {pod: [client ips seen]},
"errors": {kind: count}}. Every request has a timeout and the count is fixed, so the probe
always ends by itself."""

from __future__ import annotations

import argparse
import errno
import json
import random
import socket
import time
from collections import Counter, defaultdict

_used: set[int] = set()


def bind_fresh(s: socket.socket, host: str) -> None:
    for _ in range(50):
        port = random.randint(20000, 60000)
        if port in _used:
            continue
        try:
            s.bind((host, port))
        except OSError:
            continue
        _used.add(port)
        return
    s.bind((host, 0))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("proto", choices=["tcp", "udp"])
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=2.0)
    ap.add_argument("--sport", type=int, default=0, help="fixed source port (UDP)")
    ap.add_argument("--interval", type=float, default=0.0, help="seconds between requests")
    args = ap.parse_args()
    replies: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    sources: dict[str, set[str]] = defaultdict(set)
    for i in range(min(args.count, 5000)):
        if args.interval and i:
            time.sleep(args.interval)
        try:
            if args.proto == "tcp":
                with socket.create_connection((args.host, args.port), timeout=args.timeout) as s:
                    s.settimeout(args.timeout)
                    data = s.makefile().readline()
            else:
                family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
                with socket.socket(family, socket.SOCK_DGRAM) as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    # A fresh source port per datagram (unless fixed): each is a new flow for
                    # conntrack, so every datagram is an independent load-balancing draw.
                    host = "::" if family == socket.AF_INET6 else "0.0.0.0"
                    if args.sport:
                        s.bind((host, args.sport))
                    else:
                        bind_fresh(s, host)
                    s.settimeout(args.timeout)
                    s.sendto(b"hi", (args.host, args.port))
                    data = s.recv(200).decode()
            pod, _, src = data.strip().partition(" ")
            if not pod:
                errors["empty"] += 1
                continue
            replies[pod] += 1
            sources[pod].add(src)
        except ConnectionRefusedError:
            errors["refused"] += 1
        except TimeoutError:
            errors["timeout"] += 1
        except OSError as err:
            errors[errno.errorcode.get(err.errno or 0, type(err).__name__)] += 1
    print(
        json.dumps(
            {
                "replies": replies,
                "errors": errors,
                "sources": {k: sorted(v) for k, v in sources.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
