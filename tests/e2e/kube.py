"""Test-side Kubernetes helpers: objects as kubectl would create them, and "pods without a
kubelet": a Pod object bound to a node whose status (podIP, Ready) the test sets through the
API, as a kubelet would, while a network namespace plays the pod's network."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.cluster import Cluster
from tests.netns.world import wait_for

PATHS = {
    ("v1", "Namespace"): "/api/v1/namespaces",
    ("v1", "Node"): "/api/v1/nodes",
    ("v1", "ServiceAccount"): "/api/v1/namespaces/{ns}/serviceaccounts",
    ("v1", "ConfigMap"): "/api/v1/namespaces/{ns}/configmaps",
    ("v1", "Service"): "/api/v1/namespaces/{ns}/services",
    ("v1", "Pod"): "/api/v1/namespaces/{ns}/pods",
    ("apps/v1", "DaemonSet"): "/apis/apps/v1/namespaces/{ns}/daemonsets",
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRole",
    ): "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
    ): "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
}


def collection(obj: dict[str, Any]) -> str:
    path = PATHS[(obj["apiVersion"], obj["kind"])]
    return path.format(ns=obj["metadata"].get("namespace", "default"))


class Kube:
    def __init__(self, cluster: Cluster) -> None:
        self.c = cluster

    def create(self, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        path = collection(obj) + ("?dryRun=All" if dry_run else "")
        out: dict[str, Any] = self.c.ok("POST", path, obj)
        return out

    def apply_files(self, *files: Path, dry_run: bool = False) -> list[dict[str, Any]]:
        """Server-side apply of every object in ``files`` (as ``kubectl apply
        --server-side [--dry-run=server]``); returns the objects as the server sees them."""
        out = []
        for f in files:
            for doc in yaml.safe_load_all(f.read_text()):
                if not doc:
                    continue
                path = f"{collection(doc)}/{doc['metadata']['name']}?fieldManager=pyproxy-e2e"
                path += "&force=true" + ("&dryRun=All" if dry_run else "")
                code, body = self.c.request(
                    "PATCH", path, doc, content_type="application/apply-patch+yaml"
                )
                if code >= 300:
                    raise RuntimeError(f"{doc['kind']} {doc['metadata']['name']}: {body}")
                out.append(body)
        return out

    def delete(self, path: str) -> None:
        if "/pods/" in path:  # no kubelet will confirm a graceful deletion
            path += "?gracePeriodSeconds=0"
        code, body = self.c.request("DELETE", path)
        if code not in (200, 202, 404):
            raise RuntimeError(f"DELETE {path}: {code} {body}")

    def patch_status(self, path: str, status: dict[str, Any]) -> None:
        self.c.ok(
            "PATCH",
            path + "/status",
            {"status": status},
            content_type="application/merge-patch+json",
        )

    # ---- services -------------------------------------------------------------------------

    def service(
        self, ns: str, name: str, ports: list[dict[str, Any]], selector: dict[str, str], **spec: Any
    ) -> dict[str, Any]:
        return self.create(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"selector": selector, "ports": ports, **spec},
            }
        )

    def get_service(self, ns: str, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self.c.ok("GET", f"/api/v1/namespaces/{ns}/services/{name}")
        return out

    def slices(self, ns: str, service: str) -> list[dict[str, Any]]:
        body = self.c.ok(
            "GET",
            f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
            f"?labelSelector=kubernetes.io/service-name={service}",
        )
        return list(body["items"])

    def ready_addresses(self, ns: str, service: str) -> set[str]:
        return {
            a
            for s in self.slices(ns, service)
            for e in s.get("endpoints") or []
            if (e.get("conditions") or {}).get("ready")
            for a in e["addresses"]
        }

    # ---- nodes and pods ---------------------------------------------------------------

    def node(self, name: str, zone: str = "zone-a") -> None:
        code, body = self.c.request(
            "POST",
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {"topology.kubernetes.io/zone": zone, "kubernetes.io/hostname": name},
                },
            },
        )
        if code not in (201, 409):
            raise RuntimeError(f"node {name}: {body}")
        self.patch_status(
            f"/api/v1/nodes/{name}",
            {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "netns node",
                        "lastHeartbeatTime": _now(),
                        "lastTransitionTime": _now(),
                    }
                ]
            },
        )

    def pod(
        self,
        ns: str,
        name: str,
        node: str,
        ip: str,
        labels: dict[str, str],
        ready: bool = True,
        ip6: str | None = None,
    ) -> None:
        self.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "labels": labels},
                "spec": {
                    "nodeName": node,
                    "containers": [
                        {
                            "name": "echo",
                            "image": "echo:none",
                            "ports": [
                                {"containerPort": 8080},
                                {"containerPort": 5353, "protocol": "UDP"},
                            ],
                        }
                    ],
                },
            }
        )
        self.set_pod_status(ns, name, ip, ready, ip6)

    def set_pod_status(
        self, ns: str, name: str, ip: str, ready: bool, ip6: str | None = None
    ) -> None:
        state = "True" if ready else "False"
        ips = [{"ip": ip}] + ([{"ip": ip6}] if ip6 else [])
        self.patch_status(
            f"/api/v1/namespaces/{ns}/pods/{name}",
            {
                "phase": "Running",
                "podIP": ip,
                "podIPs": ips,
                "hostIP": "172.31.0.1",
                "startTime": _now(),
                "conditions": [
                    {"type": t, "status": state, "lastTransitionTime": _now()}
                    for t in ("Ready", "ContainersReady")
                ]
                + [{"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()}],
            },
        )

    def namespace(self, name: str) -> None:
        code, body = self.c.request(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
        if code not in (201, 409):
            raise RuntimeError(f"namespace {name}: {body}")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# The e2e tests wait on a real control plane: a longer default bound than the netns tests.
eventually = functools.partial(wait_for, timeout=30, interval=0.2)
