"""A pod's echo server: TCP and UDP answer "<pod name> <client ip>".

TCP: the greeting is sent on connect; each further line is answered with "<name> <line>",
so a held connection shows which pod it is still talking to. Runs until killed, inside the
pod's network namespace only."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import socket


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--tcp", type=int, default=8080)
    ap.add_argument("--udp", type=int, default=5353)
    args = ap.parse_args()
    name = args.name

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")[0]
        try:
            writer.write(f"{name} {peer}\n".encode())
            await writer.drain()
            while line := await reader.readline():
                cmd, _, arg = line.decode().strip().partition(" ")
                if cmd == "GEN":  # stream N deterministic bytes, then close
                    left = int(arg)
                    block = bytes(range(256)) * 256
                    while left > 0:
                        writer.write(block[: min(left, len(block))])
                        left -= len(block)
                        await writer.drain()
                    break
                if cmd == "SHA":  # read N bytes, answer their sha256
                    digest = hashlib.sha256()
                    left = int(arg)
                    while left > 0:
                        chunk = await reader.read(min(left, 65536))
                        if not chunk:
                            break
                        digest.update(chunk)
                        left -= len(chunk)
                    writer.write(f"{name} {digest.hexdigest()}\n".encode())
                    await writer.drain()
                    continue
                writer.write(f"{name} {line.decode().strip()}\n".encode())
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    class Udp(asyncio.DatagramProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

        def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
            self.transport.sendto(f"{name} {addr[0]}".encode(), addr)  # type: ignore[attr-defined]

    server = await asyncio.start_server(handle, ["0.0.0.0", "::"], args.tcp)
    loop = asyncio.get_running_loop()
    await loop.create_datagram_endpoint(Udp, local_addr=("0.0.0.0", args.udp))
    v6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    v6.bind(("::", args.udp))
    await loop.create_datagram_endpoint(Udp, sock=v6)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
