"""The iptables toolkit shared by every mode that writes iptables rules (iptables, ipvs,
userspace): ``rules`` is pure text (jump rules from built-in chains, the masquerade mark,
local-traffic matches); ``tables`` applies through the kernel layer (choosing the back end,
the IPv6 probe, batched jump ensuring, cleanup of a mode's chains)."""
