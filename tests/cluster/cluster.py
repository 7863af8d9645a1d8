"""A real control plane on loopback: etcd, kube-apiserver (TLS, RBAC, static tokens) and
kube-controller-manager running the EndpointSlice controller, from the binaries that
``build.sh`` made (or PYPROXY_KUBE_APISERVER / PYPROXY_KUBE_CONTROLLER_MANAGER / PYPROXY_ETCD).

Everything listens on 127.0.0.1 only and is stopped by ``stop()``. Used by the e2e fixtures
and by ``make cluster`` / ``make cluster-down`` (``python -m tests.cluster.cluster up|down``).

Tokens: ``admin`` (system:masters) for the tests, and ``pyproxy`` for the identity
system:serviceaccount:kube-system:pyproxy, which gets exactly the ClusterRole in deploy/.
The watch cache is disabled for Services and EndpointSlices so that compacting etcd really
makes an old resourceVersion 410 Gone (the cache would otherwise keep serving it); the
benchmarks turn it on (``Cluster.watch_cache``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
K8S_VERSION = os.environ.get("K8S_VERSION", "v1.36.3")
ETCD_VERSION = os.environ.get("ETCD_VERSION", "v3.6.10")
CACHE = Path(
    os.environ.get(
        "PYPROXY_CLUSTER_CACHE",
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pyproxy" / "cluster",
    )
)
BIN = CACHE / f"bin-{K8S_VERSION}-etcd-{ETCD_VERSION}"
SERVICE_CIDR = "10.96.0.0/16"
ADMIN_TOKEN = "pyproxy-e2e-admin-token"
PYPROXY_TOKEN = "pyproxy-e2e-proxy-token"
KUBE_PROXY_TOKEN = "pyproxy-e2e-kube-proxy-token"


def binary(name: str) -> Path | None:
    env = {
        "kube-apiserver": "PYPROXY_KUBE_APISERVER",
        "kube-controller-manager": "PYPROXY_KUBE_CONTROLLER_MANAGER",
        "kube-proxy": "PYPROXY_KUBE_PROXY",
        "etcd": "PYPROXY_ETCD",
    }[name]
    if os.environ.get(env):
        return Path(os.environ[env])
    p = BIN / name
    return p if p.exists() else None


def missing_binaries() -> list[str]:
    return [n for n in ("etcd", "kube-apiserver", "kube-controller-manager") if binary(n) is None]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d: Path, ips: tuple[str, ...] = ("127.0.0.1", "10.96.0.1")) -> None:
    d.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=pyproxy-e2e-ca",
        cwd=d,
    )
    (d / "san.cnf").write_text(
        "[req]\ndistinguished_name=dn\n[dn]\n[ext]\nsubjectAltName="
        + "".join(f"IP:{ip}," for ip in ips)
        + "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "apiserver.key",
        "-out",
        "apiserver.csr",
        "-subj",
        "/CN=kube-apiserver",
        cwd=d,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "apiserver.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.cnf",
        "-extensions",
        "ext",
        "-out",
        "apiserver.crt",
        cwd=d,
    )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


def apiserver_security(pki: Path, tokens: Path, service_cidr: str = SERVICE_CIDR) -> list[str]:
    """kube-apiserver's TLS, static tokens, service-account keys and Service ranges (both
    clusters' API servers take these; each adds how it listens and authorizes)."""
    return [
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--token-auth-file={tokens}",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={service_cidr}",
        "--service-node-port-range=30000-32767",
        "--allow-privileged=true",
    ]


def kubeconfig(server: str, ca: Path, token: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "e2e",
            "clusters": [
                {"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca)}}
            ],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "u"}}],
        }
    )


@dataclass
class Cluster:
    workdir: Path
    etcd_port: int = 0
    etcd_peer_port: int = 0
    api_port: int = 0
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    watch_cache: bool = False
    """The API server's watch cache for Services and EndpointSlices, as a production API
    server has it (the benchmarks); off for the e2e tests, whose compaction must make an old
    resourceVersion 410 Gone."""
    controller_manager: bool = True
    """The EndpointSlice controllers. The benchmarks write their own slices for selectorless
    Services and run without them: with 50,000 such Services written they spent half a core
    for more than ten minutes beside the proxy being measured, with nothing to reconcile."""
    storage_json: bool = False
    """Objects stored in etcd as JSON rather than protobuf (``--storage-media-type``), so a
    benchmark can write objects that the API server's own creation path is too slow to reach
    its sizes with (``tests.bench.objects``)."""

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def ca(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    def kubeconfig_path(self, who: str = "admin") -> Path:
        return self.workdir / f"{who}.kubeconfig"

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    # ---- start / stop -----------------------------------------------------------------

    def start(self) -> Cluster:
        missing = missing_binaries()
        if missing:
            raise RuntimeError(f"missing binaries {missing}: run tests/cluster/build.sh")
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not (self.workdir / "pki" / "sa.key").exists():
            make_pki(self.workdir / "pki")
        self.etcd_port, self.etcd_peer_port, self.api_port = free_port(), free_port(), free_port()
        (self.workdir / "tokens.csv").write_text(
            f'{ADMIN_TOKEN},admin,admin-uid,"system:masters"\n'
            f"{PYPROXY_TOKEN},system:serviceaccount:kube-system:pyproxy,pyproxy-uid,"
            '"system:serviceaccounts,system:serviceaccounts:kube-system"\n'
            f'{KUBE_PROXY_TOKEN},system:kube-proxy,kube-proxy-uid,"system:node-proxier"\n'
        )
        for who, token in (
            ("admin", ADMIN_TOKEN),
            ("pyproxy", PYPROXY_TOKEN),
            ("kube-proxy", KUBE_PROXY_TOKEN),
        ):
            self.kubeconfig_path(who).write_text(kubeconfig(self.server, self.ca, token))
        try:
            self._start_etcd()
            self._start_apiserver()
            if self.controller_manager:
                self._start_controller_manager()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, *cmd: str) -> None:
        out = self.log(name).open("ab")
        self.procs[name] = subprocess.Popen(
            list(cmd), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def _start_etcd(self) -> None:
        data = self.workdir / "etcd-data"
        shutil.rmtree(data, ignore_errors=True)
        url = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        self._spawn(
            "etcd",
            str(binary("etcd")),
            f"--data-dir={data}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        )
        self._wait(lambda: self._http_ok(f"{url}/health"), "etcd", 60)

    def apiserver_args(self) -> list[str]:
        pki = self.workdir / "pki"
        return [
            str(binary("kube-apiserver")),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.api_port}",
            *apiserver_security(pki, self.workdir / "tokens.csv"),
            "--authorization-mode=RBAC",
            "--disable-admission-plugins=ServiceAccount",
            "--endpoint-reconciler-type=none",
            "--enable-priority-and-fairness=false",
            "--max-requests-inflight=0",
            "--max-mutating-requests-inflight=0",
            *(
                []
                if self.watch_cache
                else ["--watch-cache-sizes=services#0,endpointslices.discovery.k8s.io#0"]
            ),
            *(["--storage-media-type=application/json"] if self.storage_json else []),
            "--v=1",
        ]

    def _start_apiserver(self) -> None:
        self._spawn("kube-apiserver", *self.apiserver_args())
        self._wait(lambda: self.get("/readyz", raw=True) == "ok", "kube-apiserver", 120)

    def _start_controller_manager(self) -> None:
        self._spawn(
            "kube-controller-manager",
            str(binary("kube-controller-manager")),
            f"--kubeconfig={self.kubeconfig_path('admin')}",
            "--controllers=endpointslice-controller,endpointslice-mirroring-controller",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--use-service-account-credentials=false",
            "--v=1",
        )

    def stop_apiserver(self) -> None:
        self._stop("kube-apiserver")

    def start_apiserver(self) -> None:
        self._start_apiserver()

    def _stop(self, name: str) -> None:
        p = self.procs.pop(name, None)
        if p is None or p.poll() is not None:
            return
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)

    def stop(self) -> None:
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            self._stop(name)

    # ---- API helpers (admin) ------------------------------------------------------------

    def _ctx(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = ADMIN_TOKEN,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.server + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": content_type,
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(req, context=self._ctx(), timeout=30) as r:
                text = r.read().decode()
                return r.status, json.loads(text) if text.startswith("{") else text
        except urllib.error.HTTPError as e:
            text = e.read().decode()
            return e.code, json.loads(text) if text.startswith("{") else text

    def get(self, path: str, raw: bool = False) -> Any:
        try:
            code, body = self.request("GET", path)
        except OSError:
            return None
        return body if code == 200 else None

    def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        code, out = self.request(method, path, body, **kw)
        if code >= 300:
            raise RuntimeError(f"{method} {path}: HTTP {code}: {out}")
        return out

    def etcd(self, path: str, body: Any) -> Any:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.etcd_port}{path}",
            data=json.dumps(body).encode(),
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def compact(self) -> int:
        """Compact etcd to its current revision: every older resourceVersion is now Gone."""
        rev = int(self.etcd("/v3/kv/range", {"key": "AA=="})["header"]["revision"])
        self.etcd("/v3/kv/compaction", {"revision": rev, "physical": True})
        return rev

    @staticmethod
    def _http_ok(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def _wait(self, pred: Any, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    tail = self.log(name).read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"{name} exited ({p.returncode}):\n{tail}")
            if pred():
                return
            time.sleep(0.2)
        raise RuntimeError(f"{what} not ready after {timeout}s; see {self.log(what)}")


class ExternalCluster(Cluster):
    """An existing cluster given by a kubeconfig (server, CA, bearer token): the tests that
    only talk to the API (server-side dry runs) run against it; the ones that need to stop
    the API server, compact etcd or relay a proxy to it skip."""

    def __init__(self, kubeconfig_file: Path) -> None:
        import base64
        import tempfile

        import yaml

        cfg = yaml.safe_load(kubeconfig_file.read_text())
        ctx_name = cfg.get("current-context")
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        cl = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        if "token" not in user:
            raise RuntimeError(f"{kubeconfig_file}: only bearer-token users are supported")
        super().__init__(Path(tempfile.mkdtemp(prefix="pyproxy-external-")))
        self._server = cl["server"]
        self._token = user["token"]
        if "certificate-authority-data" in cl:
            ca = self.workdir / "ca.crt"
            ca.write_bytes(base64.b64decode(cl["certificate-authority-data"]))
            self._ca = ca
        else:
            self._ca = Path(cl["certificate-authority"])

    @property
    def server(self) -> str:
        return str(self._server)

    @property
    def ca(self) -> Path:
        return self._ca

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        return super().request(method, path, body, token or self._token, content_type)

    def start(self) -> Cluster:
        return self

    def stop(self) -> None:
        pass


STATE = Path(os.environ.get("PYPROXY_CLUSTER_DIR", "/tmp/pyproxy-cluster"))


def main(argv: list[str]) -> int:
    if argv[:1] == ["up"]:
        c = Cluster(STATE).start()
        (STATE / "state.json").write_text(
            json.dumps({"pids": {n: p.pid for n, p in c.procs.items()}, "server": c.server})
        )
        print(f"control plane up: {c.server}\nadmin kubeconfig: {c.kubeconfig_path('admin')}")
        return 0
    if argv[:1] == ["down"]:
        state = STATE / "state.json"
        if not state.exists():
            print("no cluster running")
            return 0
        pids = json.loads(state.read_text())["pids"]
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            pid = pids.get(name)
            if pid is None:
                continue
            try:
                os.killpg(pid, signal.SIGTERM)
                for _ in range(100):  # up to 20 s for a graceful stop, then kill
                    os.kill(pid, 0)
                    time.sleep(0.2)
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        state.unlink()
        print("control plane stopped")
        return 0
    print("usage: python -m tests.cluster.cluster up|down", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
