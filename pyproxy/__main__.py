"""``python -m pyproxy``: the same as the ``pyproxy`` command."""

from pyproxy.cli import main

main()
