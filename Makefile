# pyproxy developer tasks. `make install` then `make test` is the whole set-up.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DEBS   := iptables ipset conntrack nftables iproute2 ipvsadm user-mode-linux procps kmod \
          buildah debootstrap runc containernetworking-plugins openssl busybox-static \
          clang-14 libbpf-dev libbpf1
# The BPF programs, compiled at install (clang is a build tool: the daemon loads the object
# through libbpf and needs no compiler).
BPF_OBJS := pyproxy/backends/ebpf/bpf/sock_lb.o

.PHONY: install debs test unit lint e2e bench bench-quick soak demo cluster cluster-down clean \
        real-build real-cluster real-smoke conformance network-e2e network-e2e-lb

install: debs $(BIN)/pyproxy $(BPF_OBJS)

pyproxy/backends/ebpf/bpf/%.o: pyproxy/backends/ebpf/bpf/%.c
	clang-14 -O2 -g -target bpf -I/usr/include/$$(uname -m)-linux-gnu \
		-fdebug-prefix-map=$(CURDIR)=. -c $< -o $@

debs:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  missing=""; for p in $(DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then echo "installing Debian packages:$$missing"; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; fi; \
	else echo "not root or not Debian: install $(DEBS) yourself"; fi

$(BIN)/pyproxy: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

test: $(BIN)/pyproxy $(BPF_OBJS)
	$(BIN)/pytest -q -rs -m "not e2e and not image and not realcluster"

unit: $(BIN)/pyproxy
	$(BIN)/pytest -q tests/unit

lint: $(BIN)/pyproxy
	$(BIN)/ruff check pyproxy tests
	$(BIN)/ruff format --check pyproxy tests
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(BIN)/pyproxy $(BPF_OBJS)
	tests/cluster/build.sh
	$(BIN)/python -m tests.bench.side_by_side --sizes 1000,5000,10000
	$(BIN)/python -m tests.bench.kernel_load --services 10000 --endpoints 10 --backend nft
	$(BIN)/python -m tests.bench.kernel_load --services 10000 --endpoints 10 --backend legacy
	$(BIN)/python -m tests.bench.userspace
	$(BIN)/python -m tests.bench.side_by_side --sizes 1000,10000,50000 --modes ebpf,nftables \
		--churn-seconds 0 --out tests/bench/results/ebpf
	$(BIN)/python -m tests.bench.data_plane --sizes 10,10000

bench-quick: $(BIN)/pyproxy $(BPF_OBJS)
	tests/cluster/build.sh
	$(BIN)/python -m tests.bench.side_by_side --quick
	$(BIN)/python -m tests.bench.data_plane --quick

# An hour of one endpoint change a second at 10,000 services (iptables mode): RSS every 10
# minutes. Not in CI.
soak: $(BIN)/pyproxy
	tests/cluster/build.sh
	$(BIN)/python -m tests.bench.side_by_side --sizes 10000 --modes iptables --proxies pyproxy \
		--repeats 1 --churn-seconds 3600 --out tests/bench/results/soak

demo: $(BIN)/pyproxy
	$(BIN)/python -m tests.demo

e2e: $(BIN)/pyproxy
	tests/cluster/build.sh
	$(BIN)/pytest -q -rs -m e2e tests/e2e

image:
	tests/image/build.sh

image-test: $(BIN)/pyproxy $(BPF_OBJS)
	$(BIN)/pytest -q -rs -m image tests/image

cluster: $(BIN)/pyproxy
	tests/cluster/build.sh
	$(BIN)/python -m tests.cluster.cluster up

cluster-down: $(BIN)/pyproxy
	$(BIN)/python -m tests.cluster.cluster down
	$(BIN)/python -m tests.cluster.real down

# The real cluster: two nodes (kubelet, containerd, CNI) in network namespaces, the control
# plane in its own, pyproxy as its DaemonSet. Builds from Go modules on first use (progress).
# FAMILY=ipv4 (default), ipv6 or dual; real-smoke brings up a dual-stack cluster.
FAMILY ?= ipv4
real-build: $(BIN)/pyproxy
	tests/cluster/build.sh node metallb
	tests/cluster/images.sh

real-cluster: real-build
	$(BIN)/python -m tests.cluster.real up --family $(FAMILY)

real-smoke: real-build
	$(BIN)/pytest -q -rs -m realcluster tests/realcluster

# Upstream's [sig-network] conformance tests (e2e.test v1.36.3) with upstream kube-proxy, then
# pyproxy in iptables, nftables and ebpf mode, on the real cluster (brought up, or reused if up).
conformance: $(BIN)/pyproxy
	tests/cluster/build.sh conformance
	tests/cluster/images.sh
	$(BIN)/python -m tests.cluster.conformance

# Upstream's whole [sig-network] suite with upstream's own job's skip for each mode and FAMILY,
# upstream kube-proxy then pyproxy in iptables, nftables and ebpf mode (hours: not in CI).
network-e2e: $(BIN)/pyproxy
	tests/cluster/build.sh conformance
	tests/cluster/images.sh
	$(BIN)/python -m tests.cluster.network_e2e --family $(FAMILY)

# Upstream's LoadBalancer tests, with MetalLB (layer 2) as the cluster's provider.
network-e2e-lb: $(BIN)/pyproxy
	tests/cluster/build.sh conformance metallb
	tests/cluster/images.sh
	$(BIN)/python -m tests.cluster.network_e2e --family $(FAMILY) --loadbalancer

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache $(BPF_OBJS)
