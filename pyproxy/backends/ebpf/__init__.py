"""ebpf mode (issue 23, in progress): services balanced at the socket by cgroup BPF programs
(``bpf/sock_lb.c``), their map entries rendered from the state (``render.py``, in the byte
layout of ``layout.py``). Not a registered mode yet: the programs, their kernel ports and the
render exist, tested in tests/bpf and tests/unit/test_ebpf_render.py."""
