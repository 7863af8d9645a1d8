"""One node of the real cluster: its container runtime (containerd with Debian's runc), its CNI
configuration (ptp + host-local + portmap, one pod CIDR per node) and its kubelet, each with
its own directories, sockets and cgroup root, because a kubelet kills runtime pods it does not
know: two kubelets must never share a containerd.

The configurations are what ``../shared/reference/real-cluster.md`` found this machine needs:
``restrict_oom_score_adj`` (no CAP_SYS_RESOURCE here, so the pause container's -998 is
refused), ``failCgroupV1: false`` (this machine's cgroups are v1), cgroupfs and a cgroupRoot of
the node's own.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from tests.cluster import host

PAUSE = "registry.k8s.io/pause:3.10.2"


@dataclass
class Node:
    name: str
    addresses: tuple[str, ...]  # one per IP family, the primary first (kubelet's --node-ip)
    pod_cidrs: tuple[str, ...]  # likewise
    dns: str  # the cluster DNS's address in the primary family
    state: Path  # this node's directory

    @property
    def address(self) -> str:
        """The node's primary address (its first InternalIP)."""
        return self.addresses[0]

    @property
    def netns(self) -> str:
        return host.PREFIX + self.name

    @property
    def sock(self) -> Path:
        return self.state / "containerd" / "containerd.sock"

    def containerd_config(self) -> str:
        d = self.state / "containerd"
        return f"""version = 3
root = "{d}/root"
state = "{d}/state"
[grpc]
  address = "{self.sock}"
[ttrpc]
  address = "{self.sock}.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "{d}/opt"
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['/usr/lib/cni']
    conf_dir = '{self.state}/cni'
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = '/usr/sbin/runc'
        Root = '{d}/runc'
        SystemdCgroup = false
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = '{self.state}/registries'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{PAUSE}'
"""

    def cni_config(self) -> str:
        # ptp, not bridge: no br_netfilter settings (upstream's local-up-cluster chose the
        # same); ipMasq off, since masquerading to other nodes' pods breaks source-IP tests.
        return json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "pyk",
                "plugins": [
                    {
                        "type": "ptp",
                        "ipMasq": False,
                        "ipam": {
                            "type": "host-local",
                            "dataDir": str(self.state / "ipam"),
                            "ranges": [[{"subnet": c}] for c in self.pod_cidrs],
                            "routes": [
                                {"dst": "::/0" if ":" in c else "0.0.0.0/0"} for c in self.pod_cidrs
                            ],
                        },
                    },
                    {"type": "portmap", "capabilities": {"portMappings": True}},
                ],
            },
            indent=1,
        )

    def kubelet_config(self) -> str:
        return json.dumps(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "failCgroupV1": False,
                "cgroupDriver": "cgroupfs",
                "cgroupRoot": "/" + host.PREFIX + self.name,
                "containerRuntimeEndpoint": f"unix://{self.sock}",
                "clusterDNS": [self.dns],
                "clusterDomain": "cluster.local",
                "resolvConf": str(self.state / "resolv.conf"),
                "failSwapOn": False,
                # An IPv6 wildcard takes both families (the node namespace's bindv6only is 0).
                "address": "::" if len(self.addresses) > 1 else self.address,
                "healthzBindAddress": "127.0.0.1",
                "readOnlyPort": 0,
                "podLogsDir": str(self.state / "pod-logs"),
                "authentication": {
                    "anonymous": {"enabled": True},
                    "webhook": {"enabled": False},
                    "x509": {},
                },
                "authorization": {"mode": "AlwaysAllow"},
                "imageGCHighThresholdPercent": 100,
                "imageGCLowThresholdPercent": 99,
                "evictionHard": {
                    "memory.available": "100Mi",
                    "nodefs.available": "0%",
                    "nodefs.inodesFree": "0%",
                    "imagefs.available": "0%",
                },
                "serializeImagePulls": False,
                "protectKernelDefaults": False,
                "rotateCertificates": False,
                "serverTLSBootstrap": False,
                "maxPods": 60,
                "nodeStatusReportFrequency": "10s",
                "syncFrequency": "10s",
            },
            indent=1,
        )

    def import_images(self, holder: int, bins: Path, archives: list[Path]) -> None:
        """Image archives into the node's containerd, where its kubelet finds them."""
        for a in archives:
            host.inside(
                holder,
                self.netns,
                str(bins / "ctr"),
                f"--address={self.sock}",
                "-n",
                "k8s.io",
                "images",
                "import",
                str(a),
                timeout=600,
            )

    def start(self, holder: int, bins: Path, kubeconfig: Path, archives: list[Path]) -> list[int]:
        """containerd, the images, then the kubelet; returns their pids."""
        for d in ("containerd", "cni", "ipam", "pod-logs", "kubelet"):
            (self.state / d).mkdir(parents=True, exist_ok=True)
        (self.state / "resolv.conf").write_text("")
        cfg = self.state / "containerd.toml"
        cfg.write_text(self.containerd_config())
        (self.state / "cni" / "10-pyk.conflist").write_text(self.cni_config())
        # Every registry is this node's loopback, where nothing listens: an image that was not
        # imported fails to pull at once, and no request leaves the node's namespace.
        hosts = self.state / "registries" / "_default" / "hosts.toml"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text(
            'server = "http://127.0.0.1:9"\n[host."http://127.0.0.1:9"]\n'
            '  capabilities = ["pull", "resolve"]\n'
        )
        host.make_cgroups(self.name)
        path = f"{bins}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        pids = [
            host.spawn(
                holder,
                self.netns,
                self.state / "containerd.log",
                # A UTS namespace of the node's own, named for it: host-network pods (and
                # the e2e tests that ask them their hostname) see the node's name, not the
                # machine's.
                "unshare",
                "--uts",
                "sh",
                "-c",
                'hostname "$0" && exec "$@"',
                self.name,
                str(bins / "containerd"),
                f"--config={cfg}",
                env={"PATH": path},
            )
        ]
        deadline = time.monotonic() + 60
        while not self.sock.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.name}: containerd did not start; see {self.state}/containerd.log"
                )
            time.sleep(0.2)
        self.import_images(holder, bins, archives)
        (self.state / "kubelet.yaml").write_text(self.kubelet_config())
        pids.append(
            host.spawn(
                holder,
                self.netns,
                self.state / "kubelet.log",
                str(bins / "kubelet"),
                f"--config={self.state / 'kubelet.yaml'}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.state / 'kubelet'}",
                f"--hostname-override={self.name}",
                f"--node-ip={','.join(self.addresses)}",
                "--v=2",
                env={"PATH": path},
            )
        )
        return pids
