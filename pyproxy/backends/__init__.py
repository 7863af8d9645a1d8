"""Backends: render the proxy state (pure) and apply it through ``pyproxy.kernel``.

``base`` defines the interface; ``registry`` maps a ``--mode`` to its backend.
"""
