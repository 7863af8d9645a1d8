"""IPVS mode, kube-proxy's layout via pyroute2: ``render`` and ``diff`` are pure,
``backend`` applies."""
