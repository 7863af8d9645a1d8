"""Command line: ``pyproxy [flags]`` runs the daemon; ``render``, ``cleanup``, ``explain``,
``status``, ``version``.

Flag names follow kube-proxy's where the concept is the same. Every flag is one entry of
``pyproxy.config.load.SETTINGS``; the flags the user gave, a ``--config`` file and the
defaults become one ``ProxyConfig``. Every bad value ends with one line
``pyproxy: error: <flag or field>: <reason>`` and exit status 2, never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import yaml

from pyproxy import __version__
from pyproxy.backends import registry
from pyproxy.backends.base import BackendError, BackendUnavailable
from pyproxy.cli import memory
from pyproxy.cli.logs import setup_logging
from pyproxy.config.load import (
    ConfigError,
    Setting,
    all_settings,
    default_document,
    load,
    own_settings,
)
from pyproxy.config.settings import (
    IPTABLES_BACKENDS,
    LOG_FORMATS,
    LOG_LEVELS,
    DetectLocalMode,
    ProxyConfig,
)
from pyproxy.model.types import ProxyState

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def _settings() -> dict[str, Setting]:
    """Every setting, the modes' own included (as registered now)."""
    return {s.name: s for s in all_settings(registry.modes(), registry.DEFAULT)}


def _opt(name: str, *decls: str, help: str, **kw: Any) -> Decorator:
    """A click option for setting ``name``, with the table's flag and default."""
    setting = _settings()[name]
    flag = setting.flag
    names = list(decls) if any("/" in d for d in decls) else list(dict.fromkeys((flag, *decls)))
    if "is_flag" not in kw and "type" not in kw:
        kw["show_default"] = setting.default not in (None, "")
    return click.option(*names, name, default=setting.default, help=help, **kw)


def _bool_opt(name: str, help: str) -> Decorator:
    """A boolean flag as upstream's (Go) flags take it: ``--flag``, ``--flag=true`` or
    ``--flag=false`` (the form its documentation and DaemonSets use)."""
    return _opt(name, type=click.BOOL, is_flag=False, flag_value=True, show_default=True,
                metavar="[=true|false]", help=help)  # fmt: skip


OUTPUT_OPTION = click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text")
"""The tools' ``-o text|json``."""


def _from_daemon_option(help: str) -> Decorator:
    """``--from-daemon URL``: a running pyproxy's metrics address, where it serves /debug."""
    return click.option("--from-daemon", "daemon_url", default=None, metavar="URL", help=help)


class _ModeChoice(click.Choice):  # type: ignore[type-arg]
    """The registered modes, read when the flag is parsed (a test may register one)."""

    def __init__(self) -> None:
        super().__init__([])

    @property  # type: ignore[override]
    def choices(self) -> list[str]:
        return [m.name for m in registry.modes()]

    @choices.setter
    def choices(self, _: Any) -> None:
        pass


def _mode_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return _opt("mode", "--mode", type=_ModeChoice(), show_default=True, help="Proxy backend.")(f)


def _modes_own_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The settings modes declare for themselves, as options."""
    for s in reversed(own_settings(registry.modes())):
        if s.default is True or s.default is False:
            f = _bool_opt(s.name, help=s.help)(f)
        elif s.choices:
            f = _opt(s.name, type=click.Choice(s.choices), show_default=True, help=s.help)(f)
        else:
            f = _opt(s.name, help=s.help)(f)
    return f


RULE_OPTIONS: tuple[Decorator, ...] = (
    click.option(
        "--manifests",
        "manifests",
        default=None,
        type=click.Path(file_okay=False),
        help="Read objects from the YAML files in DIR instead of an API server.",
    ),
    _opt("hostname_override", "--node", help="This node's name (default: the host name)."),
    _opt("cluster_cidr", help="Pod CIDR(s), one per family; traffic from outside is masqueraded."),
    _opt(
        "detect_local_mode",
        type=click.Choice([m.value for m in DetectLocalMode]),
        show_default=True,
        help="How pod traffic is recognised: --cluster-cidr, or the Node's spec.podCIDRs.",
    ),
    _bool_opt("masquerade_all", help="SNAT all traffic sent to cluster IPs."),
    _opt(
        "masquerade_bit",
        type=int,
        show_default=True,
        help="Bit of the fwmark used for masquerading.",
    ),
    _opt(
        "nodeport_addresses",
        help="CIDRs, 'primary' (the Node's IPs) or 'localhost' that accept NodePorts; "
        "default: every local address (nftables mode: primary).",
    ),
    _bool_opt("localhost_nodeports", help="Accept NodePort connections to 127.0.0.1 (IPv4)."),
    _opt(
        "iptables_backend",
        type=click.Choice(IPTABLES_BACKENDS),
        show_default=True,
        help="iptables back end (auto detects the one in use).",
    ),
    _bool_opt(
        "service_metrics",
        help="Export pyproxy_service_{connections,packets,bytes}_total per service port "
        "(nftables mode: a named counter per service port).",
    ),
    click.option(
        "--config",
        "config_file",
        default=None,
        help="KubeProxyConfiguration YAML file; flags override it.",
    ),
)


def _api_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Where the objects come from when not --manifests: a kubeconfig or --master."""
    f = _opt("master", help="API server address (overrides the kubeconfig).")(f)
    return _opt("kubeconfig", help="Path to a kubeconfig file.")(f)


def _rule_options(f: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed(RULE_OPTIONS):
        f = opt(f)
    return f


def _config(ctx: click.Context, params: dict[str, Any], **fixed: Any) -> ProxyConfig:
    """Flags the user gave (not click's defaults) over --config over the defaults."""
    settings = _settings()
    given = {
        k: v
        for k, v in params.items()
        if k in settings
        and ctx.get_parameter_source(k) not in (None, click.core.ParameterSource.DEFAULT)
    }
    return load({**given, **fixed}, params.get("config_file"), registry.modes(), registry.DEFAULT)


def load_manifest_state(directory: Path, node: str) -> ProxyState:
    from pyproxy.sources.manifests import ManifestsSource
    from pyproxy.sync.tracker import ChangeTracker

    tracker = ChangeTracker(node)
    ManifestsSource(directory, tracker.apply).initial()
    return tracker.current_state()


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@_mode_option
@_rule_options
@_api_options
@_opt("min_sync_period", "--iptables-min-sync-period", help="Minimum interval between syncs.")
@_opt("sync_period", "--iptables-sync-period", help="Maximum interval between syncs.")
@_modes_own_options
@_opt("metrics_bind_address", help="host:port for /metrics; empty disables it.")
@_opt(
    "service_metrics_max_series",
    type=int,
    show_default=True,
    help="At most this many service ports in those metrics (the first in name order).",
)
@_opt("healthz_bind_address", help="host:port for /healthz and /livez; empty disables it.")
@_opt("conntrack_max_per_core", type=int, help="Conntrack entries per CPU (0: leave the size).")
@_opt("conntrack_min", type=int, help="The least conntrack table size maxPerCore sets.")
@_opt("conntrack_tcp_timeout_established", help="Idle established TCP timeout (0: leave it).")
@_opt("conntrack_tcp_timeout_close_wait", help="TCP CLOSE_WAIT timeout (0: leave it).")
@_bool_opt("conntrack_tcp_be_liberal", help="Let conntrack accept out-of-window TCP packets.")
@_opt("conntrack_udp_timeout", help="UDP timeout (0: leave it).")
@_opt("conntrack_udp_timeout_stream", help="UDP stream timeout (0: leave it).")
@click.option("--v", "verbosity", type=int, default=None, help="klog-style verbosity (4+ = debug).")
@_opt("log_level", type=click.Choice(LOG_LEVELS), show_default=True, help="Log level.")
@_opt("log_format", type=click.Choice(LOG_FORMATS), show_default=True, help="Log format.")
@click.option("--write-config-to", default=None, help="Write the default configuration and exit.")
@click.pass_context
def cli(ctx: click.Context, /, **params: Any) -> None:
    """pyproxy: a Kubernetes Service proxy. Without a command, runs the daemon."""
    if ctx.invoked_subcommand is not None:
        return
    if params["write_config_to"]:
        Path(params["write_config_to"]).write_text(
            yaml.safe_dump(default_document(registry.modes(), registry.DEFAULT), sort_keys=False)
        )
        return
    setup_logging(params["log_level"], params["log_format"], params["verbosity"])
    cfg = _config(ctx, params)
    setup_logging(cfg.log_level, cfg.log_format, params["verbosity"])
    from pyproxy.cli.daemon import Daemon

    ctx.exit(Daemon(cfg).run())


@cli.command()
@_mode_option
@_rule_options
@click.pass_context
def render(ctx: click.Context, /, **params: Any) -> None:
    """Print the rules the backend would program for --manifests DIR; touches nothing."""
    setup_logging("warning", "text", None)
    cfg = _config(ctx, params)
    if cfg.source.manifests is None:
        raise ConfigError("--manifests: required for render")
    backend = registry.create(cfg)
    state = load_manifest_state(cfg.source.manifests, cfg.node_name)
    click.echo(backend.render(state), nl=False)


@cli.command()
@_mode_option
@_rule_options
@_api_options
@_from_daemon_option("Ask a running pyproxy: its kernel against its own state and flags.")
@OUTPUT_OPTION
@click.pass_context
def diff(ctx: click.Context, /, output: str, daemon_url: str | None, **params: Any) -> None:
    """Compare pyproxy's objects in this network namespace's kernel with what it would program
    now (for --manifests DIR, the API server's current objects, or a running daemon's state).
    Status 0 when they agree, 1 when they differ, 2 on a usage error."""
    import json

    from pyproxy.backends.base import Difference
    from pyproxy.tools.diff import report

    setup_logging("warning", "text", None)
    if daemon_url is not None:
        doc = json.loads(from_daemon(daemon_url, "/debug/diff"))
        diffs = [Difference(d["service"], d["obj"], tuple(d["missing"]), tuple(d["unexpected"]))
                 for d in doc["differences"]]  # fmt: skip
        click.echo(report(diffs, output), nl=False)
        ctx.exit(1 if diffs else 0)
    cfg = _config(ctx, params)
    backend = registry.create(cfg)
    diffs = backend.compare(_load_state(cfg))
    click.echo(report(diffs, output), nl=False)
    ctx.exit(1 if diffs else 0)


@cli.command("trace")
@_mode_option
@_rule_options
@_api_options
@click.option("--from", "src", required=True, metavar="IP", help="The client's address.")
@click.option(
    "--to",
    "dest",
    required=True,
    metavar="ADDRESS:PORT",
    help="Where it connects: a cluster, external, load-balancer or node IP and port.",
)
@click.option(
    "--protocol", type=click.Choice(["tcp", "udp", "sctp"]), default="tcp", show_default=True
)
@OUTPUT_OPTION
@click.pass_context
def trace_cmd(ctx: click.Context, /, src: str, dest: str, protocol: str, output: str,
              **params: Any) -> None:  # fmt: skip
    """Follow the first packet of a connection through the rules pyproxy renders for the
    current objects (--manifests DIR, or the API server's) and this namespace's addresses:
    each rule it matches, the endpoints it reaches with their probabilities, masquerading,
    and where it is dropped or rejected. Status 0, or 2 on a usage error."""
    import ipaddress

    from pyproxy.backends.trace import Packet
    from pyproxy.cli.walk import with_local_addresses
    from pyproxy.model.types import Protocol
    from pyproxy.tools.trace import report

    setup_logging("warning", "text", None)
    try:
        client = ipaddress.ip_address(src)
    except ValueError:
        raise ConfigError(f"--from: {src!r} is not an IP address") from None
    host, colon, port = dest.rpartition(":")
    try:
        to = ipaddress.ip_address(host.strip("[]"))
        number = int(port)
    except ValueError:
        raise ConfigError(f"--to: {dest!r} is not ADDRESS:PORT") from None
    if not colon or not 0 < number < 65536 or to.version != client.version:
        raise ConfigError(f"--to: {dest!r} is not ADDRESS:PORT of --from's IP family")
    cfg = _config(ctx, params)
    backend = registry.create(cfg)
    state = with_local_addresses(_load_state(cfg))
    packet = Packet(client, to, number, Protocol(protocol.upper()))
    click.echo(report(backend.trace(state, packet), output), nl=False)


def load_api_state(cfg: ProxyConfig) -> ProxyState:
    """One list of every kind from the API server, as the daemon's first sync sees it."""
    from pyproxy.model.events import Event, EventType
    from pyproxy.sources.apiserver import ApiServerSource, load_client
    from pyproxy.sync.tracker import ChangeTracker

    tracker = ChangeTracker(cfg.node_name)
    source = ApiServerSource(
        load_client(cfg.source.kubeconfig, cfg.source.master), cfg.node_name, tracker.apply
    )
    for res in source.resources:
        try:
            source.list_all(res)
        except Exception as err:
            if not res.optional:
                raise BackendUnavailable(f"cannot list {res.kind}: {err}") from None
        tracker.apply(Event(res.kind, EventType.SYNCED))
    return tracker.current_state()


@cli.command()
@_mode_option
@_opt("iptables_backend", type=click.Choice(IPTABLES_BACKENDS), help="iptables back end.")
@_modes_own_options
@click.pass_context
def cleanup(ctx: click.Context, /, mode: str, **params: Any) -> None:
    """Remove everything pyproxy programmed for --mode (kube-proxy's --cleanup)."""
    setup_logging("info", "text", None)
    registry.create(_config(ctx, params, mode=mode)).cleanup()
    click.echo(f"pyproxy: cleaned up {mode} rules")


@cli.command("explain")
@click.argument("service")
@_mode_option
@_rule_options
@_api_options
@_from_daemon_option("Ask a running pyproxy (its metrics address, e.g. http://127.0.0.1:10249).")
@OUTPUT_OPTION
@click.pass_context
def explain_cmd(ctx: click.Context, /, service: str, daemon_url: str | None, output: str,
                **params: Any) -> None:  # fmt: skip
    """Why SERVICE (namespace/name[:port]) reaches the endpoints it does on this node, and
    where each of its addresses leads through --mode's objects (for --manifests DIR, the API
    server's objects, or a running pyproxy's state)."""
    import json

    from pyproxy.cli.walk import walk_of, with_local_addresses
    from pyproxy.model.types import NamespacedName
    from pyproxy.tools.explain import explain, explain_data

    setup_logging("warning", "text", None)
    ns, slash, rest = service.partition("/")
    if not slash or not ns or not rest:
        raise ConfigError(f"SERVICE: {service!r} is not namespace/name[:port]")
    name, _, port = rest.partition(":")
    if daemon_url is not None:
        query = "/debug/explain?service=" + service + ("&output=json" if output == "json" else "")
        click.echo(from_daemon(daemon_url, query), nl=False)
        return
    cfg = _config(ctx, params)
    if cfg.source.manifests is None and not (cfg.source.kubeconfig or cfg.source.master):
        raise ConfigError("--manifests, --kubeconfig or --from-daemon: one is required")
    backend = registry.create(cfg)
    state = with_local_addresses(_load_state(cfg))
    walk = walk_of(cfg, backend, state)
    svc = NamespacedName(ns, name)
    if output == "json":
        click.echo(json.dumps(explain_data(state, svc, port or None, walk), indent=1))
        return
    click.echo(explain(state, svc, port or None, walk), nl=False)


def _load_state(cfg: ProxyConfig) -> ProxyState:
    if cfg.source.manifests is not None:
        if not Path(cfg.source.manifests).is_dir():
            raise ConfigError(f"--manifests: {cfg.source.manifests} is not a readable directory")
        return load_manifest_state(cfg.source.manifests, cfg.node_name)
    return load_api_state(cfg)


@cli.command()
@_opt("iptables_backend", type=click.Choice(IPTABLES_BACKENDS), help="iptables back end.")
@_from_daemon_option("Also the running pyproxy's own status (its metrics address).")
@OUTPUT_OPTION
@click.option(
    "--mode",
    type=_ModeChoice(),
    default=None,
    help="Whose counters to read (default: the daemon's mode, else the default mode).",
)
def status(iptables_backend: str, daemon_url: str | None, output: str, mode: str | None) -> None:
    """The daemon's status (with --from-daemon: mode, last sync, pending changes, counts,
    skipped objects, and what it counted per service port) and the kernel's counters in the
    mode's terms: connections per service and endpoint (iptables rule counters), per virtual
    and real server (IPVS), per service port (nftables, with --service-metrics)."""
    import json

    from pyproxy.tools import status as st

    setup_logging("warning", "text", None)
    state = json.loads(from_daemon(daemon_url, "/debug/state")) if daemon_url else None
    chosen = registry.get(mode or (state["mode"] if state else ""))
    doc: dict[str, Any] = {"daemon": None}
    text = ""
    if state is not None:
        doc["daemon"] = {k: v for k, v in state.items() if k != "services"}
        text = st.summary(state)
        try:
            doc["traffic"] = json.loads(from_daemon(daemon_url or "", "/debug/traffic"))
            text += st.traffic_report(doc["traffic"])
        except (ConfigError, BackendError) as err:  # its mode counts nothing per service
            doc["traffic"], text = None, text + f"per service port: {err}\n"
    if chosen.counters is not None:
        key, doc[key], report = chosen.counters(
            ProxyConfig(mode=chosen.name, iptables_backend=iptables_backend)
        )
        text += report
    elif state is None:
        text += f"{chosen.name} mode: the daemon keeps the counts; use --from-daemon\n"
    click.echo(json.dumps(doc, indent=1) if output == "json" else text, nl=output == "json")


def from_daemon(url: str, path: str) -> str:
    """GET ``path`` from a running pyproxy's metrics address; one line on failure."""
    import urllib.error
    import urllib.parse
    import urllib.request

    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ConfigError(f"--from-daemon: {url!r} is not an http(s) URL")
    try:
        with urllib.request.urlopen(url.rstrip("/") + path, timeout=30) as r:
            return str(r.read().decode())
    except urllib.error.HTTPError as err:
        why = f"--from-daemon: {err.code} {err.read().decode().strip()}"
        if err.code >= 500:  # the daemon could not answer (a mode without it, no privilege)
            raise BackendUnavailable(why) from None
        raise ConfigError(why) from None
    except OSError as err:
        raise BackendUnavailable(f"--from-daemon: cannot reach {url}: {err}") from None


@cli.command()
def version() -> None:
    """Print the version."""
    click.echo(f"pyproxy {__version__}")


def main(argv: list[str] | None = None) -> None:
    memory.tune_gc()
    try:
        # Not standalone: click returns ctx.exit()'s status instead of exiting with it.
        status = cli.main(args=argv, prog_name="pyproxy", standalone_mode=False)
        if isinstance(status, int) and status:
            sys.exit(status)
    except click.exceptions.NoSuchOption as err:
        _fail(f"{err.option_name}: no such option")
    except click.BadParameter as err:
        name = err.param.opts[0] if err.param is not None and err.param.opts else "argument"
        _fail(f"{name}: {err.message}")
    except click.UsageError as err:
        _fail(err.message)
    except ConfigError as err:
        _fail(str(err))
    except BackendError as err:
        _fail(str(err), code=1)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        sys.exit(130)


def _fail(message: str, code: int = 2) -> None:
    click.echo(f"pyproxy: error: {message}", err=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
