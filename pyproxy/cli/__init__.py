"""The command line and the daemon's wiring.

``commands`` holds the click commands (the daemon, ``render``, ``cleanup``, ``explain``,
``status``); ``daemon`` wires source -> tracker -> runner -> syncer -> backend and the HTTP
servers for a running process.
"""

from pyproxy.cli.commands import main

__all__ = ["main"]
