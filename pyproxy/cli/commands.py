"""Command line: ``pyproxy [flags]`` runs the daemon; ``render``, ``cleanup``, ``version``.

Flag names follow kube-proxy's where the concept is the same. Every bad value ends with one
line ``pyproxy: error: <flag>: <reason>`` and exit status 2, never a traceback.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import click
import yaml

from pyproxy import __version__
from pyproxy.backends import registry
from pyproxy.backends.base import BackendError, BackendUnavailable
from pyproxy.cli.options import (
    OptionError,
    Options,
    default_config,
    load_config_file,
    node_name,
    parse_bind_address,
    parse_cidrs,
    parse_duration,
    parse_nodeport_addresses,
)
from pyproxy.kernel.iptables import IptablesError

log = logging.getLogger("pyproxy")

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {
                "ts": self.formatTime(record),
                "level": record.levelname.lower(),
                "logger": record.name,
                "msg": record.getMessage(),
            }
        )


def setup_logging(level: str, fmt: str, verbosity: int | None) -> None:
    lvl = LEVELS[level]
    if verbosity is not None and verbosity >= 4:
        lvl = logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname).1s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(lvl)


def _mode_option(f: Any) -> Any:
    return click.option(
        "--mode",
        "--proxy-mode",
        "mode",
        default="iptables",
        show_default=True,
        type=click.Choice(registry.MODES),
        help="Proxy backend.",
    )(f)


def _rule_options(f: Any) -> Any:
    for opt in reversed(
        [
            click.option(
                "--manifests",
                type=click.Path(file_okay=False),
                default=None,
                help="Read objects from the YAML files in DIR instead of an API server.",
            ),
            click.option(
                "--hostname-override",
                "--node",
                "hostname_override",
                default=None,
                help="This node's name (default: the host name).",
            ),
            click.option(
                "--cluster-cidr",
                default="",
                help="Pod CIDR(s), comma-separated per family; traffic from outside is "
                "masqueraded.",
            ),
            click.option(
                "--masquerade-all",
                is_flag=True,
                default=False,
                help="SNAT all traffic sent to cluster IPs.",
            ),
            click.option(
                "--iptables-masquerade-bit",
                "masquerade_bit",
                type=int,
                default=14,
                show_default=True,
                help="Bit of the fwmark used for masquerading.",
            ),
            click.option(
                "--nodeport-addresses",
                default="",
                help="CIDRs or all/primary/localhost that NodePorts accept (default all).",
            ),
            click.option(
                "--iptables-localhost-nodeports/--no-iptables-localhost-nodeports",
                "localhost_nodeports",
                default=True,
                show_default=True,
                help="Accept NodePort connections to 127.0.0.1 (IPv4).",
            ),
            click.option(
                "--iptables-backend",
                type=click.Choice(["auto", "nft", "legacy"]),
                default="auto",
                show_default=True,
                help="iptables back end (auto detects the one in use).",
            ),
            click.option(
                "--config",
                "config_file",
                default=None,
                help="KubeProxyConfiguration YAML file; flags override it.",
            ),
        ]
    ):
        f = opt(f)
    return f


def _merge(ctx: click.Context, params: dict[str, Any]) -> Options:
    """Defaults < config file < explicitly given flags."""
    opts = Options()
    if params.get("config_file"):
        for k, v in load_config_file(params["config_file"]).items():
            setattr(opts, k, v)
    for k, v in params.items():
        if not hasattr(opts, k):
            continue
        src = ctx.get_parameter_source(k)
        if src is not None and src.name in ("DEFAULT", "DEFAULT_MAP") and params.get("config_file"):
            continue
        setattr(opts, k, v)
    return opts


def backend_options(opts: Options) -> dict[str, Any]:
    if not 0 <= int(opts.masquerade_bit) <= 31:
        raise OptionError("--iptables-masquerade-bit: must be within 0-31")
    return {
        "masquerade_bit": int(opts.masquerade_bit),
        "masquerade_all": bool(opts.masquerade_all),
        "cluster_cidrs": parse_cidrs("--cluster-cidr", str(opts.cluster_cidr or "")),
        "localhost_nodeports": bool(opts.localhost_nodeports),
        "nodeport_addresses": parse_nodeport_addresses(
            "--nodeport-addresses", opts.nodeport_addresses or ""
        ),
        "iptables_backend": opts.iptables_backend,
        "ipvs_scheduler": opts.ipvs_scheduler,
        "ipvs_strict_arp": bool(opts.ipvs_strict_arp),
    }


def _manifests_dir(value: str | None) -> Path | None:
    if value is None:
        return None
    p = Path(value)
    if not p.is_dir():
        raise OptionError(f"--manifests: {value} is not a readable directory")
    return p


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@_mode_option
@_rule_options
@click.option("--kubeconfig", default=None, help="Path to a kubeconfig file.")
@click.option("--master", default=None, help="API server address (overrides the kubeconfig).")
@click.option(
    "--min-sync-period",
    "--iptables-min-sync-period",
    "min_sync_period",
    default="1s",
    show_default=True,
    help="Minimum interval between syncs.",
)
@click.option(
    "--sync-period",
    "--iptables-sync-period",
    "sync_period",
    default="30s",
    show_default=True,
    help="Maximum interval between syncs (a full resync).",
)
@click.option("--ipvs-scheduler", default="rr", show_default=True, help="IPVS scheduler.")
@click.option(
    "--ipvs-strict-arp",
    "ipvs_strict_arp",
    is_flag=True,
    default=False,
    help="Set arp_ignore=1 and arp_announce=2 (ipvs mode).",
)
@click.option("--metrics-bind-address", default="127.0.0.1:10249", show_default=True)
@click.option("--healthz-bind-address", default="0.0.0.0:10256", show_default=True)
@click.option("--v", "verbosity", type=int, default=None, help="klog-style verbosity (4+ = debug).")
@click.option("--log-level", type=click.Choice(list(LEVELS)), default="info", show_default=True)
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@click.option("--write-config-to", default=None, help="Write the default configuration and exit.")
@click.pass_context
def cli(ctx: click.Context, /, **params: Any) -> None:
    """pyproxy: a Kubernetes Service proxy. Without a command, runs the daemon."""
    if ctx.invoked_subcommand is not None:
        return
    if params["write_config_to"]:
        Path(params["write_config_to"]).write_text(
            yaml.safe_dump(default_config(), sort_keys=False)
        )
        return
    verbosity = params.pop("verbosity")
    setup_logging(params["log_level"], params["log_format"], verbosity)
    opts = _merge(ctx, params)
    from pyproxy.cli.daemon import Daemon, DaemonConfig

    bopts = backend_options(opts)
    metrics_address = parse_bind_address("--metrics-bind-address", opts.metrics_bind_address)
    healthz_address = parse_bind_address("--healthz-bind-address", opts.healthz_bind_address)
    min_sync = parse_duration("--min-sync-period", opts.min_sync_period)
    sync = parse_duration("--sync-period", opts.sync_period)
    if sync <= 0:
        raise OptionError("--sync-period: must be greater than 0")
    if min_sync > sync:
        raise OptionError("--min-sync-period: must not exceed --sync-period")
    manifests = _manifests_dir(opts.manifests)
    if manifests is None and opts.kubeconfig and not Path(opts.kubeconfig).is_file():
        raise OptionError(f"--kubeconfig: {opts.kubeconfig} is not a readable file")
    cfg = DaemonConfig(
        mode=opts.mode,
        node_name=node_name(opts.hostname_override),
        min_sync_period=min_sync,
        sync_period=sync,
        backend_options=bopts,
        manifests=manifests,
        kubeconfig=opts.kubeconfig,
        master=opts.master,
        metrics_address=metrics_address,
        healthz_address=healthz_address,
    )
    ctx.exit(Daemon(cfg).run())


def load_manifest_state(directory: Path, node: str) -> Any:
    from pyproxy.sources.manifests import ManifestsSource
    from pyproxy.sync.tracker import ChangeTracker

    tracker = ChangeTracker(node)
    ManifestsSource(directory, tracker.apply).initial()
    return tracker.current_state()


@cli.command()
@_mode_option
@_rule_options
@click.pass_context
def render(ctx: click.Context, /, **params: Any) -> None:
    """Print the rules the backend would program for --manifests DIR; touches nothing."""
    setup_logging("warning", "text", None)
    opts = _merge(ctx, params)
    manifests = _manifests_dir(opts.manifests)
    if manifests is None:
        raise OptionError("--manifests: required for render")
    backend = registry.create(opts.mode, backend_options(opts))
    state = load_manifest_state(manifests, node_name(opts.hostname_override))
    click.echo(backend.render(state), nl=False)


@cli.command()
@_mode_option
@click.option("--iptables-backend", type=click.Choice(["auto", "nft", "legacy"]), default="auto")
def cleanup(mode: str, iptables_backend: str) -> None:
    """Remove everything pyproxy programmed for --mode (kube-proxy's --cleanup)."""
    setup_logging("info", "text", None)
    backend = registry.create(mode, {"iptables_backend": iptables_backend})
    backend.cleanup()
    click.echo(f"pyproxy: cleaned up {mode} rules")


@cli.command("explain")
@click.argument("service")
@click.option("--manifests", default=None, help="Objects from the YAML files in DIR.")
@click.option("--hostname-override", "--node", "hostname_override", default=None)
def explain_cmd(service: str, manifests: str | None, hostname_override: str | None) -> None:
    """Why SERVICE (namespace/name[:port]) reaches the endpoints it does, on this node."""
    from pyproxy.model.types import NamespacedName
    from pyproxy.tools.explain import explain

    setup_logging("warning", "text", None)
    ns, slash, rest = service.partition("/")
    if not slash or not ns or not rest:
        raise OptionError(f"SERVICE: {service!r} is not namespace/name[:port]")
    name, _, port = rest.partition(":")
    directory = _manifests_dir(manifests)
    if directory is None:
        raise OptionError("--manifests: required for explain")
    state = load_manifest_state(directory, node_name(hostname_override))
    click.echo(explain(state, NamespacedName(ns, name), port or None), nl=False)


@cli.command()
@click.option("--iptables-backend", type=click.Choice(["auto", "nft", "legacy"]), default="auto")
def status(iptables_backend: str) -> None:
    """Connections per service and endpoint, from the programmed rules' counters."""
    from pyproxy.kernel.iptables import Iptables, detect_backend
    from pyproxy.tools.status import read, report

    setup_logging("warning", "text", None)
    try:
        ipt = Iptables(detect_backend(iptables_backend))
    except IptablesError as err:
        raise BackendUnavailable(str(err)) from None
    click.echo(report(read(ipt)), nl=False)


@cli.command()
def version() -> None:
    """Print the version."""
    click.echo(f"pyproxy {__version__}")


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="pyproxy", standalone_mode=False)
    except click.exceptions.NoSuchOption as err:
        _fail(f"{err.option_name}: no such option")
    except click.BadParameter as err:
        name = err.param.opts[0] if err.param is not None and err.param.opts else "argument"
        _fail(f"{name}: {err.message}")
    except click.UsageError as err:
        _fail(err.message)
    except OptionError as err:
        _fail(str(err))
    except BackendUnavailable as err:
        _fail(str(err), code=1)
    except BackendError as err:
        _fail(str(err), code=1)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)


def _fail(message: str, code: int = 2) -> None:
    click.echo(f"pyproxy: error: {message}", err=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
