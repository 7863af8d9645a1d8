"""ebpf mode (issue 23, in progress): services balanced at the socket by cgroup BPF programs
(``bpf/sock_lb.c``). Not a registered mode yet: only the programs and their kernel ports
exist, tested in tests/bpf."""
