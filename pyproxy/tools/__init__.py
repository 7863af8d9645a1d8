"""Operator tools behind the ``pyproxy`` subcommands: ``explain`` (why a service reaches the
endpoints it does) and ``status`` (traffic counters from the programmed rules)."""
