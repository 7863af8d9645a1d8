"""API-server source: list+watch of Services, EndpointSlices and this node's Node object.

Uses the official client for configuration and authentication (kubeconfig, ``--master``,
in-cluster service account) and its ``call_api`` for raw JSON list/watch requests, so events
reach the converter in the same camelCase shape as manifests do.

Per kind, one thread: list (emit REPLACE, then SYNCED once), then watch from the list's
resourceVersion with bookmarks. A dropped watch resumes from the last resourceVersion seen
(after 0.5 s when it had been established); 410 Gone (the version was compacted) relists;
errors reaching the API server back off exponentially (0.5 s doubling to 30 s). While the
API server is unreachable nothing is emitted, so the tracker keeps the last known state and
the programmed rules stay.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from kubernetes import client, config

from pyproxy.model.events import Event, EventType

log = logging.getLogger(__name__)

NOT_OURS = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"
BACKOFF_MIN = 0.5
BACKOFF_MAX = 30.0
WATCH_TIMEOUT = 300


class SourceError(RuntimeError):
    pass


class ApiStatus(SourceError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Gone(Exception):
    """The resourceVersion we hold was compacted away: relist."""


@dataclass(frozen=True)
class Resource:
    kind: str
    path: str
    label_selector: str = ""
    field_selector: str = ""
    optional: bool = False
    """A kind the cluster may not serve (older API servers, narrower RBAC): without it the
    source reports an empty list once instead of retrying forever."""


@dataclass
class WatchStats:
    lists: int = 0
    watches: int = 0
    reconnects: int = 0
    gone: int = 0
    events: int = 0
    errors: list[str] = field(default_factory=list)


def load_client(kubeconfig: str | None, master: str | None) -> Any:
    """An ApiClient from --kubeconfig / --master / in-cluster config / ~/.kube/config."""
    cfg = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=cfg
            )
        else:
            try:
                config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=cfg
                )
            except config.ConfigException:
                if master:
                    cfg.host = master
                else:
                    config.load_kube_config(  # type: ignore[no-untyped-call]
                        client_configuration=cfg
                    )
    except (config.ConfigException, OSError, ValueError, TypeError) as err:
        raise SourceError(f"cannot load kubeconfig: {err}") from None
    if master:
        cfg.host = master
    return client.ApiClient(configuration=cfg)


def call(
    api: Any,
    method: str,
    path: str,
    timeout: tuple[float, float],
    query: list[tuple[str, str]] | None = None,
    body: Any = None,
) -> Any:
    """One raw request with the client's auth; returns the unread urllib3 response. Lists
    ask for gzip, as client-go's transport does: the API server compresses large responses
    (5,000 EndpointSlices here: 8.4 MB of JSON in 0.5 MB), and urllib3 decodes them."""
    headers = {"Accept": "application/json"}
    if method == "GET":
        headers["Accept-Encoding"] = "gzip"
    if body is not None:
        headers["Content-Type"] = "application/json"
    method, url, headers, data, post = api.param_serialize(
        method,
        path,
        query_params=query or [],
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    return api.call_api(
        method, url, header_params=headers, body=data, post_params=post, _request_timeout=timeout
    ).response


def resources(node_name: str) -> tuple[Resource, ...]:
    return (
        Resource("Service", "/api/v1/services", NOT_OURS),
        Resource("EndpointSlice", "/apis/discovery.k8s.io/v1/endpointslices", NOT_OURS),
        Resource("Node", "/api/v1/nodes", field_selector=f"metadata.name={node_name}"),
        Resource("ServiceCIDR", "/apis/networking.k8s.io/v1/servicecidrs", optional=True),
    )


class ApiServerSource:
    def __init__(self, api: Any, node_name: str, sink: Callable[[Event], object]) -> None:
        self.api = api
        self.sink = sink
        self.resources = resources(node_name)
        self.stats: dict[str, WatchStats] = {r.kind: WatchStats() for r in self.resources}
        self.on_reconnect: Callable[[str], None] | None = None
        self.on_relist: Callable[[str], None] | None = None

    def _request(self, res: Resource, params: dict[str, str], timeout: tuple[float, float]) -> Any:
        """A raw GET; returns the streaming urllib3 response. Raises ApiStatus on non-2xx."""
        query = [(k, v) for k, v in params.items() if v]
        if res.label_selector:
            query.append(("labelSelector", res.label_selector))
        if res.field_selector:
            query.append(("fieldSelector", res.field_selector))
        resp = call(self.api, "GET", res.path, timeout, query=query)
        if not 200 <= resp.status < 300:
            data = resp.data[:300].decode(errors="replace")
            resp.release_conn()
            raise ApiStatus(resp.status, f"GET {res.path}: HTTP {resp.status}: {data}")
        return resp

    def list_all(self, res: Resource) -> str:
        """The first list of a kind is served from the API server's watch cache
        (``resourceVersion=0``), as upstream's informers do: no read from etcd for every node
        that starts. A relist after an error reads the latest state."""
        first = {"resourceVersion": "0"} if self.stats[res.kind].lists == 0 else {}
        resp = self._request(res, {"limit": "500", **first}, (10, 60))
        items: list[Mapping[str, Any]] = []
        body = orjson.loads(resp.data)
        rv = str(body.get("metadata", {}).get("resourceVersion", ""))
        items += body.get("items") or []
        cont = body.get("metadata", {}).get("continue")
        while cont:
            resp = self._request(res, {"limit": "500", "continue": cont}, (10, 60))
            body = orjson.loads(resp.data)
            items += body.get("items") or []
            cont = body.get("metadata", {}).get("continue")
        kind_items = [{**i, "kind": res.kind} for i in items]
        self.stats[res.kind].lists += 1
        if self.stats[res.kind].lists > 1 and self.on_relist is not None:
            self.on_relist(res.kind)
        self.sink(Event(res.kind, EventType.REPLACE, objects=kind_items))
        return rv

    def watch(self, res: Resource, rv: str, stop: threading.Event) -> Iterator[str]:
        """Stream events from ``rv``; yields each new resourceVersion. Raises Gone on 410."""
        params = {
            "watch": "1",
            "resourceVersion": rv,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_TIMEOUT),
        }
        resp = self._request(res, params, (10, WATCH_TIMEOUT + 30))
        self.stats[res.kind].watches += 1
        try:
            buf = b""
            for chunk in resp.stream(65536):
                if stop.is_set():
                    return
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        new_rv = self._handle(res, orjson.loads(line))
                        if new_rv:
                            yield new_rv
        finally:
            resp.release_conn()

    def _handle(self, res: Resource, ev: Mapping[str, Any]) -> str:
        etype = ev.get("type")
        obj = ev.get("object") or {}
        if etype == "ERROR":
            if obj.get("code") == 410:
                raise Gone(obj.get("message", "410 Gone"))
            raise SourceError(f"watch error: {obj.get('message', obj)}")
        rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        if etype == "BOOKMARK":
            return rv
        try:
            et = EventType(str(etype))
        except ValueError:
            log.warning("%s watch: unknown event type %r", res.kind, etype)
            return rv
        self.stats[res.kind].events += 1
        self.sink(Event(res.kind, et, {**obj, "kind": res.kind}))
        return rv

    def run_resource(self, res: Resource, stop: threading.Event) -> None:
        stats = self.stats[res.kind]
        rv = ""
        synced = False
        backoff = BACKOFF_MIN
        while not stop.is_set():
            established = stats.watches
            try:
                if not rv:
                    rv = self.list_all(res)
                    if not synced:
                        self.sink(Event(res.kind, EventType.SYNCED))
                        synced = True
                for new_rv in self.watch(res, rv, stop):
                    rv = new_rv  # the resume point if the watch drops
                    backoff = BACKOFF_MIN
                backoff = BACKOFF_MIN  # a watch that timed out normally: resume at once
                continue
            except ApiStatus as err:
                if res.optional and err.status in (403, 404) and not synced:
                    log.info("%s: not served here (%s); going on without", res.kind, err.status)
                    self.sink(Event(res.kind, EventType.REPLACE, objects=[]))
                    self.sink(Event(res.kind, EventType.SYNCED))
                    return
                if err.status == 410:
                    stats.gone += 1
                    rv = ""
                self._retry_note(res, stats, err, backoff)
            except Gone as err:
                stats.gone += 1
                log.info("%s watch: resourceVersion %s is gone (%s); relisting", res.kind, rv, err)
                rv = ""
                continue
            except Exception as err:
                if _is_gone(err):
                    stats.gone += 1
                    rv = ""
                elif stats.watches > established:
                    # The watch was established and then cut mid-stream: the API server is
                    # there, so resume soon (as upstream's reflector does) instead of backing
                    # off further with every cut (8 s after the fourth cut in a minute).
                    backoff = BACKOFF_MIN
                self._retry_note(res, stats, err, backoff)
            stop.wait(backoff)
            backoff = min(BACKOFF_MAX, backoff * 2)

    def _retry_note(self, res: Resource, stats: WatchStats, err: Exception, backoff: float) -> None:
        stats.reconnects += 1
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        stats.errors.append(msg)
        del stats.errors[:-20]
        log.warning(
            "%s watch: %s; retrying in %.1fs (keeping last known state)", res.kind, msg, backoff
        )
        if self.on_reconnect is not None:
            self.on_reconnect(res.kind)

    def start(self, stop: threading.Event) -> list[threading.Thread]:
        threads = []
        for res in self.resources:
            t = threading.Thread(
                target=self.run_resource, args=(res, stop), name=f"watch-{res.kind}", daemon=True
            )
            t.start()
            threads.append(t)
        return threads


def _is_gone(err: Exception) -> bool:
    return getattr(err, "status", None) == 410


class EventRecorder:
    """Posts core/v1 Events about this node (start-up, repeated sync failures).

    Best effort: a failure to post is logged, never raised."""

    def __init__(self, api: Any, node_name: str, component: str = "pyproxy") -> None:
        self.api = api
        self.node_name = node_name
        self.component = component

    def post(self, event_type: str, reason: str, message: str) -> None:
        import datetime as dt

        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{self.node_name}.", "namespace": "default"},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node_name,
                "uid": self.node_name,
            },
            "reason": reason,
            "message": message,
            "type": event_type,
            "source": {"component": self.component, "host": self.node_name},
            "reportingComponent": self.component,
            "reportingInstance": self.node_name,
            "firstTimestamp": now[:19] + "Z",
            "lastTimestamp": now[:19] + "Z",
            "count": 1,
        }
        try:
            resp = call(self.api, "POST", "/api/v1/namespaces/default/events", (5, 10), body=body)
            if not 200 <= resp.status < 300:
                log.warning("cannot record event %s: HTTP %d", reason, resp.status)
        except Exception as err:
            log.warning("cannot record event %s: %s", reason, err)
