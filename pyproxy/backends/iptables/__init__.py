"""iptables mode, with upstream kube-proxy's chain layout (``render``) and an applier that
programs it with one iptables-restore transaction per table and family (``backend``)."""
