"""nftables mode: upstream kube-proxy v1.36's nftables ruleset (table ``kube-proxy`` per IP
family, verdict maps keyed by address, protocol and port), written in transactions that cost
what changed."""
