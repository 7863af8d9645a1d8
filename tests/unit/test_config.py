"""Flags and a KubeProxyConfiguration file -> ProxyConfig -> backend, and NodePort addresses
chosen from the node's facts."""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path

import pytest

from pyproxy.backends import registry
from pyproxy.backends.base import BackendUnavailable
from pyproxy.backends.iptables.backend import IptablesBackend
from pyproxy.backends.ipvs.backend import IpvsBackend
from pyproxy.backends.nftables.backend import NftablesBackend
from pyproxy.config.load import ConfigError, default_document
from pyproxy.config.settings import DetectLocalMode, ProxyConfig
from pyproxy.model import convert
from pyproxy.model.nodeports import NodePortAddresses
from pyproxy.model.types import IPFamily, NodeInfo
from tests.helpers import load_config as load
from tests.helpers import node

ip = ipaddress.ip_address
net = ipaddress.ip_network


def config_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" + body
    )
    return str(path)


def test_defaults_are_upstreams() -> None:
    cfg = load({"hostname_override": "node-a"})
    assert cfg.mode == "iptables" and cfg.node_name == "node-a"
    assert (cfg.min_sync_period, cfg.sync_period) == (1.0, 30.0)
    assert cfg.masquerade.mark == "0x4000" and not cfg.masquerade.all
    assert cfg.nodeport_addresses.all and cfg.localhost_nodeports
    assert cfg.metrics_address == ("127.0.0.1", 10249)
    assert cfg.healthz_address == ("0.0.0.0", 10256)
    assert cfg.detect_local_mode is DetectLocalMode.CLUSTER_CIDR


def test_flags_override_the_file_which_overrides_defaults(tmp_path: Path) -> None:
    path = config_file(
        tmp_path,
        "clusterCIDR: 10.244.0.0/16,fd00::/48\n"
        "iptables: {masqueradeAll: true, masqueradeBit: 10, syncPeriod: 1m}\n"
        "nodePortAddresses: [10.0.0.0/8]\n",
    )
    cfg = load({"hostname_override": "n"}, path)
    assert cfg.cluster_cidrs == (net("10.244.0.0/16"), net("fd00::/48"))
    assert cfg.masquerade.all and cfg.masquerade.bit == 10 and cfg.sync_period == 60.0
    assert cfg.nodeport_addresses.cidrs == (net("10.0.0.0/8"),)
    flagged = load({"hostname_override": "n", "masquerade_bit": 12, "sync_period": "5s"}, path)
    assert flagged.masquerade.bit == 12 and flagged.sync_period == 5.0
    assert flagged.masquerade.all  # not given as a flag: the file's value stays


def test_sync_period_and_masquerade_come_from_the_modes_section(tmp_path: Path) -> None:
    path = config_file(
        tmp_path,
        "mode: ipvs\n"
        "iptables: {syncPeriod: 10s, masqueradeBit: 3}\n"
        "ipvs: {syncPeriod: 20s, scheduler: wrr}\n"
        "nftables: {syncPeriod: 40s, masqueradeBit: 5}\n",
    )
    ipvs = load({"hostname_override": "n"}, path)
    assert ipvs.mode == "ipvs" and ipvs.sync_period == 20.0 and ipvs.masquerade.bit == 3
    assert ipvs.option("ipvs_scheduler") == "wrr"
    nft = load({"hostname_override": "n", "mode": "nftables"}, path)
    assert nft.sync_period == 40.0 and nft.masquerade.bit == 5


def test_nftables_defaults_nodeports_to_primary() -> None:
    assert load({"hostname_override": "n", "mode": "nftables"}).nodeport_addresses.primary
    assert load({"hostname_override": "n", "mode": "iptables"}).nodeport_addresses.all


def test_unknown_file_field_is_named_in_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = config_file(tmp_path, "winkernel: {networkName: l2}\nbogusField: 1\nipvs: {}\n")
    with caplog.at_level(logging.WARNING):
        load({"hostname_override": "n"}, path)
    warned = {r.getMessage() for r in caplog.records}
    assert f"--config {path}: field winkernel.networkName is not supported by pyproxy; ignored" in (
        warned
    )
    assert f"--config {path}: field bogusField is not supported by pyproxy; ignored" in warned


@pytest.mark.parametrize(
    "body,message",
    [
        ("iptables: {masqueradeBit: 40}\n", "iptables.masqueradeBit: must be within 0-31"),
        ("iptables: {syncPeriod: soon}\n", "iptables.syncPeriod: invalid duration 'soon'"),
        ("clusterCIDR: 10.0.0.0/33\n", "clusterCIDR: '10.0.0.0/33' is not a CIDR"),
        ("mode: turbo\n", "mode: 'turbo' is not one of iptables, ipvs, userspace, nftables"),
        ("nodePortAddresses: [primary, 10.0.0.0/8]\n", "can't use both 'primary' and CIDRs"),
        ("metricsBindAddress: here\n", "metricsBindAddress: 'here' is not host:port"),
        ("iptables: {masqueradeAll: maybe}\n", "iptables.masqueradeAll: 'maybe' is not true"),
    ],
)
def test_bad_file_values_name_the_field(tmp_path: Path, body: str, message: str) -> None:
    path = config_file(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        load({"hostname_override": "n"}, path)
    assert str(err.value).startswith(f"--config {path}: ")
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "flags,message",
    [
        ({"masquerade_bit": 32}, "--iptables-masquerade-bit: must be within 0-31"),
        ({"sync_period": "0s"}, "--sync-period: must be greater than 0"),
        ({"min_sync_period": "1m"}, "--min-sync-period: must not exceed the sync period"),
        ({"hostname_override": " "}, "--hostname-override: must not be empty"),
        ({"nodeport_addresses": "all,primary"}, "--nodeport-addresses: 'all' cannot be combined"),
        ({"ipvs_scheduler": "fastest"}, "--ipvs-scheduler: 'fastest' is not one of rr,"),
    ],
)
def test_bad_flag_values_name_the_flag(flags: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(")):
        load({"hostname_override": "n", **flags})


def test_written_defaults_load_back_to_the_defaults(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "defaults.yaml"
    path.write_text(yaml.safe_dump(default_document(registry.modes(), registry.DEFAULT)))
    assert load({"hostname_override": "n"}, str(path)) == load({"hostname_override": "n"})


def test_backends_are_built_from_the_configuration() -> None:
    cfg = load({"hostname_override": "n", "masquerade_bit": 9, "cluster_cidr": "10.9.0.0/16"})
    backend = registry.create(cfg)
    assert isinstance(backend, IptablesBackend)
    assert backend.configs[IPFamily.IPV4].mark == "0x200"
    ipvs = registry.create(ProxyConfig(mode="ipvs").with_options(ipvs_scheduler="sh"))
    assert isinstance(ipvs, IpvsBackend) and ipvs.configs[IPFamily.IPV4].scheduler == "sh"
    assert isinstance(registry.create(ProxyConfig(mode="nftables")), NftablesBackend)
    with pytest.raises(BackendUnavailable, match="unknown mode 'turbo'"):
        registry.create(ProxyConfig(mode="turbo"))


# ---- NodePort addresses from the node's facts --------------------------------------------


NODE = convert.node_info(
    node("n", addresses=["192.168.0.2", "fd00::2"], external=["203.0.113.7"])
).with_local_addresses(
    (ip("127.0.0.1"), ip("192.168.0.2"), ip("10.1.2.3"), ip("::1"), ip("fd00::2"))
)


def test_node_addresses_internal_first_and_pod_cidrs() -> None:
    n = convert.node_info(
        node(
            "n", addresses=["10.0.0.5"], external=["1.2.3.4", "bogus"], pod_cidrs=["10.244.3.0/24"]
        )
    )
    assert n.addresses == (ip("10.0.0.5"), ip("1.2.3.4"))
    assert n.primary_ip(IPFamily.IPV4) == ip("10.0.0.5") and n.primary_ip(IPFamily.IPV6) is None
    assert n.pod_cidr(IPFamily.IPV4) == net("10.244.3.0/24")


def test_primary_is_the_nodes_ip_of_each_family() -> None:
    npa = NodePortAddresses.parse(["primary"])
    assert npa.node_ips(NODE, IPFamily.IPV4) == (ip("192.168.0.2"),)
    assert npa.node_ips(NODE, IPFamily.IPV6) == (ip("fd00::2"),)
    # As upstream's GetNodeIPs: a primary IP on no interface of this host selects nothing...
    elsewhere = NODE.with_local_addresses((ip("127.0.0.1"), ip("10.1.2.3")))
    assert npa.node_ips(elsewhere, IPFamily.IPV4) == ()
    # ... and rendering offline (no interface addresses known) it is the Node object's IP.
    assert npa.node_ips(NODE.with_local_addresses(()), IPFamily.IPV4) == (ip("192.168.0.2"),)
    # As upstream: a family with no known node IP accepts NodePorts everywhere.
    assert npa.node_ips(NodeInfo("bare"), IPFamily.IPV4) is None
    assert not npa.contains_ipv4_loopback


def test_cidrs_localhost_and_all() -> None:
    cidr = NodePortAddresses.parse(["10.0.0.0/8"])
    assert cidr.node_ips(NODE, IPFamily.IPV4) == (ip("10.1.2.3"),)
    assert cidr.node_ips(NODE, IPFamily.IPV6) is None  # no IPv6 CIDR: every IPv6 address
    both = NodePortAddresses.parse(["primary", "localhost"])
    assert both.node_ips(NODE, IPFamily.IPV4) == (ip("192.168.0.2"), ip("127.0.0.1"))
    assert both.contains_ipv4_loopback
    assert NodePortAddresses.parse([]).node_ips(NODE, IPFamily.IPV4) is None
    assert NodePortAddresses.parse(["all"]).all
    assert NodePortAddresses.parse(["127.0.0.0/8"]).contains_ipv4_loopback


def test_detect_local_mode_node_cidr_uses_the_nodes_pod_cidr() -> None:
    n = convert.node_info(node("n", pod_cidrs=["10.244.7.0/24", "fd00:7::/64"]))
    cfg = ProxyConfig(
        detect_local_mode=DetectLocalMode.NODE_CIDR, cluster_cidrs=(net("10.0.0.0/8"),)
    )
    assert cfg.local_cidrs(n, IPFamily.IPV4) == (net("10.244.7.0/24"),)
    assert cfg.local_cidrs(n, IPFamily.IPV6) == (net("fd00:7::/64"),)
    assert ProxyConfig(cluster_cidrs=(net("10.0.0.0/8"),)).local_cidrs(n, IPFamily.IPV4) == (
        net("10.0.0.0/8"),
    )


def test_every_modes_own_settings_reach_any_mode() -> None:
    """A start in nftables mode removes what ebpf mode pinned where ebpf's own setting says
    (Mode.outlives), so the setting is parsed and carried whatever the mode."""
    cfg = load({"hostname_override": "n", "mode": "nftables", "bpf_pin_dir": "/x/pins"})
    assert cfg.option("bpf_pin_dir") == "/x/pins"
    assert load({"hostname_override": "n", "mode": "iptables"}).option("bpf_pin_dir") == ""


def test_conntrack_defaults_are_upstreams_and_zero_leaves_each_alone(tmp_path: Path) -> None:
    """kube-proxy's defaults (v1alpha1 defaults.go): 32768 per CPU, at least 131072, 24 h
    established, 1 h CLOSE_WAIT; 0 in the file leaves a setting to the node."""
    ct = load({"hostname_override": "n"}).conntrack
    assert ct.table_size(2) == 131072 and ct.table_size(8) == 262144
    assert ct.table_size(64) == 1048576  # capped, as upstream
    assert ct.sysctls() == [
        ("net.netfilter.nf_conntrack_tcp_timeout_established", 86400),
        ("net.netfilter.nf_conntrack_tcp_timeout_close_wait", 3600),
    ]
    fields = "maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s, udpTimeout: 30s"
    path = config_file(tmp_path, f"conntrack: {{{fields}, tcpBeLiberal: true}}\n")
    ct = load({"hostname_override": "n"}, path).conntrack
    assert ct.table_size(2) == 0
    assert ct.sysctls() == [
        ("net.netfilter.nf_conntrack_tcp_be_liberal", 1),
        ("net.netfilter.nf_conntrack_udp_timeout", 30),
    ]
    flags = {"hostname_override": "n", "conntrack_tcp_timeout_close_wait": "10m"}
    assert load(flags, path).conntrack.tcp_close_wait_timeout == 600  # a flag over the file
