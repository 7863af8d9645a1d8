# pyproxy image: a slim Debian-based Python with the netfilter tools from the distribution.
# BASE selects the base image: the public python:3.11-slim-bookworm by default; on machines
# that cannot pull, tests/image/build.sh makes a local one from Debian's packages.
ARG BASE=python:3.11-slim-bookworm

# Every dependency is pure Python or ships a wheel: the build stage needs no compiler.
FROM ${BASE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY pyproxy ./pyproxy
RUN python3 -m venv /opt/pyproxy \
 && /opt/pyproxy/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/pyproxy/bin/pip install --no-cache-dir .

FROM ${BASE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      iptables ipset conntrack nftables iproute2 kmod \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/pyproxy /opt/pyproxy
ENV PATH=/opt/pyproxy/bin:$PATH
ENTRYPOINT ["pyproxy"]
CMD ["--help"]
