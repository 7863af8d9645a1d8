"""Conversion of API-shaped Service/EndpointSlice/Node objects into the model."""

from __future__ import annotations

import logging

import pytest

from pyproxy.model import convert
from pyproxy.model.types import NamespacedName, Protocol
from tests.helpers import endpoint, endpoint_slice, node, port, service


def test_every_service_field() -> None:
    svc = service(
        "ns",
        "web",
        "10.96.0.1",
        [port("http", 80, nodePort=30080), port("", 53, "UDP")],
        clusterIPs=["10.96.0.1", "fd00::1"],
        type="LoadBalancer",
        externalIPs=["192.0.2.1", "2001:db8::1"],
        loadBalancerSourceRanges=["198.51.100.0/24"],
        sessionAffinity="ClientIP",
        sessionAffinityConfig={"clientIP": {"timeoutSeconds": 60}},
        externalTrafficPolicy="Local",
        internalTrafficPolicy="Local",
        healthCheckNodePort=31000,
        trafficDistribution="PreferClose",
        status={
            "loadBalancer": {
                "ingress": [{"ip": "203.0.113.5"}, {"ip": "203.0.113.6", "ipMode": "Proxy"}]
            }
        },
    )
    http, dns = convert.service_ports(svc)
    assert str(http.name) == "ns/web:http" and http.protocol is Protocol.TCP
    assert str(dns.name) == "ns/web" and dns.protocol is Protocol.UDP
    assert [str(i) for i in http.cluster_ips] == ["10.96.0.1", "fd00::1"]
    assert http.port == 80 and http.node_port == 30080 and dns.node_port == 0
    assert [str(i) for i in http.external_ips] == ["192.0.2.1", "2001:db8::1"]
    assert [str(i) for i in http.load_balancer_ips] == ["203.0.113.5"]  # ipMode Proxy skipped
    assert [str(n) for n in http.load_balancer_source_ranges] == ["198.51.100.0/24"]
    assert http.session_affinity_client_ip and http.sticky_max_age_seconds == 60
    assert http.external_policy_local and http.internal_policy_local
    assert http.health_check_node_port == 31000
    assert http.traffic_distribution == "PreferClose"


def test_family_view_filters_addresses() -> None:
    from pyproxy.model.types import IPFamily

    (sp,) = convert.service_ports(
        service(
            "ns",
            "a",
            "10.0.0.1",
            [port("p", 1)],
            clusterIPs=["10.0.0.1", "fd00::1"],
            externalIPs=["192.0.2.1", "2001:db8::1"],
        )
    )
    v6 = sp.for_family(IPFamily.IPV6)
    assert v6 is not None and [str(i) for i in v6.external_ips] == ["2001:db8::1"]
    (only4,) = convert.service_ports(service("ns", "b", "10.0.0.2", [port("p", 1)]))
    assert only4.for_family(IPFamily.IPV6) is None


@pytest.mark.parametrize(
    "spec",
    [
        {"clusterIP": "None"},
        {"type": "ExternalName", "externalName": "example.org"},
        {"clusterIP": ""},
    ],
)
def test_headless_and_external_name_yield_no_ports(spec: dict) -> None:
    svc = service("ns", "h", None, [port("p", 80)], **spec)
    assert convert.service_ports(svc) == ()


def test_defaults() -> None:
    (sp,) = convert.service_ports(service("ns", "a", "10.0.0.1", [{"port": 80}]))
    assert sp.protocol is Protocol.TCP and not sp.session_affinity_client_ip
    assert sp.sticky_max_age_seconds == 10800
    # externalTrafficPolicy=Local means nothing for a service that is not externally reachable
    (cl,) = convert.service_ports(
        service("ns", "b", "10.0.0.2", [port("p", 1)], externalTrafficPolicy="Local")
    )
    assert not cl.external_policy_local


@pytest.mark.parametrize(
    "ports,reason",
    [
        ([port("p", 70000)], "out of range"),
        ([port("p", 0)], "out of range"),
        ([port("p", "80")], "not an integer"),
        ([port("p", 80, "ICMP")], "unknown protocol"),
        ([{"name": "p"}], "no port number"),
        ([], "spec.ports"),
        ([port("p", 80), port("p", 81)], "duplicate"),
    ],
)
def test_bad_services_are_rejected_with_a_reason(ports: list, reason: str) -> None:
    with pytest.raises(convert.BadObject, match=reason) as err:
        convert.service_ports(service("ns", "bad", "10.0.0.1", ports))
    assert "Service ns/bad" in str(err.value)


def test_bad_cluster_ip_and_missing_metadata() -> None:
    with pytest.raises(convert.BadObject, match="invalid clusterIP"):
        convert.service_ports(service("ns", "x", "10.0.0.999", [port("p", 1)]))
    with pytest.raises(convert.BadObject, match=r"metadata\.name"):
        convert.service_ports({"kind": "Service", "spec": {}})
    with pytest.raises(convert.BadObject, match="spec is missing"):
        convert.service_ports({"kind": "Service", "metadata": {"name": "x", "namespace": "n"}})


def test_invalid_list_entries_are_dropped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    (sp,) = convert.service_ports(
        service(
            "ns",
            "a",
            "10.0.0.1",
            [port("p", 1)],
            externalIPs=["1.2.3.4", "nope"],
            type="LoadBalancer",
            loadBalancerSourceRanges=["10.0.0.0/8", "bad/99"],
        )
    )
    assert [str(i) for i in sp.external_ips] == ["1.2.3.4"]
    assert [str(n) for n in sp.load_balancer_source_ranges] == ["10.0.0.0/8"]
    assert "nope" in caplog.text and "bad/99" in caplog.text


def test_endpoint_slice_conversion() -> None:
    sl = endpoint_slice(
        "ns",
        "web",
        "web-1",
        [
            endpoint("10.1.0.1", node="n1"),
            endpoint("10.1.0.2", ready=False, serving=True, terminating=True, zones=["z1"]),
            endpoint("10.1.0.3", ready=False),
        ],
        [port("http", 8080)],
        annotations={"endpoints.kubernetes.io/last-change-trigger-time": "2026-01-02T03:04:05Z"},
    )
    info = convert.endpoint_slice(sl)
    assert info is not None and info.service == NamespacedName("ns", "web")
    assert info.ports == (("http", Protocol.TCP, 8080),)
    a, b, c = info.endpoints
    assert a.ready and a.serving and not a.terminating and a.node_name == "n1"
    assert not b.ready and b.serving and b.terminating and b.zone_hints == frozenset({"z1"})
    assert not c.ready and not c.serving  # serving defaults to ready
    assert info.trigger_time == 1767323045.0


def test_bad_slices() -> None:
    sl = endpoint_slice("ns", "web", "s", [endpoint("10.0.0.1")], [port("p", 1)])
    del sl["metadata"]["labels"]
    with pytest.raises(convert.BadObject, match="service-name"):
        convert.endpoint_slice(sl)
    with pytest.raises(convert.BadObject, match="invalid endpoint address"):
        convert.endpoint_slice(endpoint_slice("ns", "w", "s", [endpoint("x")], [port("p", 1)]))
    with pytest.raises(convert.BadObject, match="does not match"):
        convert.endpoint_slice(
            endpoint_slice("ns", "w", "s", [endpoint("fd00::1")], [port("p", 1)])
        )
    fqdn = endpoint_slice(
        "ns", "w", "s", [endpoint("10.0.0.1")], [port("p", 1)], address_type="FQDN"
    )
    assert convert.endpoint_slice(fqdn) is None


def test_node_info() -> None:
    n = node("n1", zone="z1")
    n["spec"] = {"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]}
    info = convert.node_info(n)
    assert info.name == "n1" and info.zone == "z1" and not info.eligible
    n2 = node("n2")
    n2["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert convert.node_info(n2).deleting


def test_ignored_labels() -> None:
    svc = service(
        "ns",
        "a",
        "10.0.0.1",
        [port("p", 1)],
        labels={"service.kubernetes.io/service-proxy-name": "other"},
    )
    assert convert.is_ignored_by_label(svc)
