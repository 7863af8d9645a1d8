"""The shared kernel layer: the only code that runs iptables tools, conntrack, sysctls and
netlink. Knows nothing of services; backends translate the model into calls here."""
