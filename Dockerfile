# pyproxy image: only what the daemon runs, on scratch (deploy/image_rootfs.py picks it).
# BASE selects the build stage's base: the public python:3.11-slim-bookworm by default; on
# machines that cannot pull, tests/image/build.sh makes a local one from Debian's packages.
ARG BASE=python:3.11-slim-bookworm

# Every Python dependency is pure Python or ships a wheel. The one compiler is clang, in the
# build stage only, for ebpf mode's programs (the daemon loads the object with libbpf1).
FROM ${BASE} AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      iptables nftables libnftables1 conntrack kmod libc-bin libbpf1 clang-14 libbpf-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY pyproxy ./pyproxy
COPY deploy/image_rootfs.py ./
RUN clang-14 -O2 -g -target bpf -I/usr/include/$(uname -m)-linux-gnu -fdebug-prefix-map=/src=. \
      -c pyproxy/backends/ebpf/bpf/sock_lb.c -o pyproxy/backends/ebpf/bpf/sock_lb.o
# The kubernetes client's asyncio half (kubernetes.aio, aiohttp and its helpers: 80 MB) is
# never imported by pyproxy; pip and setuptools are not needed at run time.
RUN python3 -m venv /opt/pyproxy \
 && /opt/pyproxy/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/pyproxy/bin/pip install --no-cache-dir . \
 && /opt/pyproxy/bin/pip uninstall -y -q aiohttp aiohttp-retry aiosignal aiohappyeyeballs \
      frozenlist multidict yarl propcache attrs \
 && rm -rf /opt/pyproxy/lib/python3.*/site-packages/kubernetes/aio \
 && /opt/pyproxy/bin/pip uninstall -y -q pip setuptools \
 && /opt/pyproxy/bin/python -c "import pyproxy.cli.daemon, pyproxy.sources.apiserver" \
 && /opt/pyproxy/bin/python -c "from pyproxy.backends.ebpf.programs import OBJECT; \
      assert OBJECT.exists(), OBJECT" \
 && python3 image_rootfs.py /opt/pyproxy /rootfs

FROM scratch
COPY --from=build /rootfs /
ENV PATH=/opt/pyproxy/bin:/usr/sbin:/usr/bin
ENTRYPOINT ["/opt/pyproxy/bin/pyproxy"]
CMD ["--help"]
