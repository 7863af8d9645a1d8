"""The Pods and Services the real-cluster tests create, and applying them."""

from __future__ import annotations

import json
from typing import Any

from tests.cluster import real

AGNHOST = "registry.k8s.io/e2e-test-images/agnhost:2.63.0"


def pod(
    name: str, node: str, args: list[str], labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """An agnhost pod on ``node`` (``netexec --http-port=8080`` serves /hostname)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels or {}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": AGNHOST, "args": args}],
        },
    }


def nodeport(name: str, app: str) -> dict[str, Any]:
    """A NodePort Service (port 80 to 8080) for the pods labelled app=``app``, in every IP
    family the cluster has."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "type": "NodePort",
            # Both families where the cluster has both; one where it has one.
            "ipFamilyPolicy": "PreferDualStack",
            "selector": {"app": app},
            "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}],
        },
    }


def apply_ready(*objs: dict[str, Any]) -> None:
    """Create the objects and wait for every pod among them to be Ready."""
    real.kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)}),
    )
    pods = [f"pod/{o['metadata']['name']}" for o in objs if o["kind"] == "Pod"]
    real.kubectl("wait", "--for=condition=Ready", *pods, "--timeout=180s", timeout=200)
