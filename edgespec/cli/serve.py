"""`edgespec serve`: the verifier server of split decoding (needs the [serve] extra)."""

from __future__ import annotations

import click

from edgespec.cli.common import _friendly, _read_token


@click.command()
@click.argument("bundle", type=click.Path())
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8700, show_default=True, type=int)
@click.option("--token-file", default=None, type=click.Path(), help="Require this bearer token.")
# numbers are checked by ServerConfig (one place, a message naming the flag)
@click.option("--max-sessions", default=16, show_default=True, type=int)
@click.option("--max-context", default=None, type=int, help="Positions per session.")
@click.option("--max-request-bytes", default=1 << 20, show_default=True, type=int)
@click.option("--idle-timeout", default=300.0, show_default=True, help="Seconds; frees the cache.")
@click.option("--threads", default=None, type=int, help="Intra-op threads (default: all cores).")
@click.option(
    "--max-batch",
    default=16,
    show_default=True,
    type=int,
    help="Verify rounds batched together (1: each round alone).",
)
@click.option(
    "--batch-window-ms",
    default=0.0,
    show_default=True,
    help="Wait this long for more rounds when a batch is not full (adds latency when idle).",
)
@click.option("--header-timeout", default=10.0, show_default=True, help="Seconds to send headers.")
@click.option("--body-timeout", default=10.0, show_default=True, help="Seconds to send a body.")
@click.option("--drain-seconds", default=10.0, show_default=True, help="Shutdown drain time.")
@click.option(
    "--prefill-chunk",
    default=256,
    show_default=True,
    type=int,
    help="Most prompt positions per prefill step, between other sessions' rounds (0: whole).",
)
@click.option(
    "--prefill-budget-ms",
    default=20.0,
    show_default=True,
    help="Size prefill steps to take about this long (0: always --prefill-chunk positions).",
)
@click.option("--device", default="cpu", show_default=True, help="A device profile or auto.")
@click.option(
    "--mode",
    type=click.Choice(["ar", "spec", "eagle", "self-spec", "lookup", "suffix", "recycle"]),
    default=None,
    help="How the OpenAI endpoints decode (default: the mode this bundle's calibration here "
    "favours, `edgespec bench B --calibrate`; uncalibrated: spec if it has a draft model, else "
    "self-spec at an exit whose fitted adapter pays, else lookup; the auto policy speculates "
    "only while it wins).",
)
@click.option(
    "--draft-policy",
    default=None,
    help="OpenAI endpoints: the mode's draft-length policy (fixed:N | confidence:T | "
    "acceptance | auto | dynamic-exit; default auto).",
)
@click.option(
    "--conversations",
    default=4,
    show_default=True,
    type=click.IntRange(1),
    help="OpenAI endpoints: conversations decoded at once, each keeping its own KV cache.",
)
@click.option(
    "--max-streams",
    default=4,
    show_default=True,
    type=click.IntRange(0),
    help="Split sessions the server decodes and streams at once (a device's STREAM); beyond "
    "it, or at 0, the server answers 'verify only' and devices draft themselves.",
)
@click.option(
    "--cache-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="OpenAI endpoints: keep conversations' KV caches in this folder, so that a restarted "
    "server prefills only what a prompt adds to a kept prefix (docs/server.md).",
)
@click.option(
    "--cache-bytes",
    default=1 << 30,
    show_default=True,
    type=int,
    help="--cache-dir: at most this many bytes; the least recently used prefixes go first.",
)
@click.option(
    "--cache-min-tokens",
    default=64,
    show_default=True,
    type=int,
    help="--cache-dir: prefixes shorter than this many tokens are not written.",
)
@click.option(
    "--stream-below",
    default=0,
    show_default=True,
    type=click.IntRange(0),
    help="Stream only while fewer sessions are open: at this many, new STREAMs get 'verify "
    "only' and running streams are handed back to their devices (0: no such bound).",
)
@click.option("--log-level", default="info", show_default=True)
@click.option(
    "--replicas",
    default=None,
    type=click.IntRange(1),
    help="Serve a fleet of N replicas on Ray Serve (the [fleet] extra) behind one address.",
)
@click.option(
    "--autoscale",
    default=None,
    metavar="MIN:MAX",
    help="Fleet: let Ray Serve scale between MIN and MAX replicas on ongoing sessions.",
)
@click.option(
    "--ray-address",
    default=None,
    help="Fleet: join this Ray cluster (e.g. auto, or HOST:6379); default: a local Ray.",
)
@click.option(
    "--cpus-per-replica",
    default=0.5,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="Fleet: Ray CPUs each replica reserves.",
)
@_friendly
def serve(
    bundle: str,
    host: str,
    port: int,
    token_file: str | None,
    log_level: str,
    replicas: int | None,
    autoscale: str | None,
    ray_address: str | None,
    cpus_per_replica: float,
    **limits,
):
    """Serve BUNDLE: the verifier of split decoding and the OpenAI API (/v1/chat/completions).

    With --replicas or --autoscale: a fleet of replicas on Ray Serve at the same address
    (docs/fleet.md)."""
    try:
        from edgespec.serve.server import run
        from edgespec.serve.state import ConfigError, ServerConfig
    except ImportError as e:
        raise click.ClickException(
            f"serve needs the [serve] extra ({e.name} is missing): pip install 'edgespec[serve]'"
        ) from None
    token = _read_token(token_file)
    if token is None and host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"warning: serving on {host} without --token-file: anyone can connect", err=True)
    try:
        config = ServerConfig(bundle, token, **limits)
    except ConfigError as e:
        raise click.UsageError(str(e)) from None
    if replicas is None and autoscale is None:
        if ray_address is not None:
            raise click.UsageError("--ray-address deploys a fleet: add --replicas N or --autoscale")
        run(config, host, port, log_level)
        return
    from edgespec.serve.state import FleetConfig, parse_autoscale

    try:
        scale = parse_autoscale(autoscale) if autoscale else None
        fleet_config = FleetConfig(
            replicas or 1, scale, ray_address=ray_address, cpus_per_replica=cpus_per_replica
        )
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    try:
        from edgespec.serve import fleet
    except ImportError as e:
        raise click.ClickException(
            f"--replicas needs the [fleet] extra ({e.name} is missing): "
            "pip install 'edgespec[fleet]'"
        ) from None
    fleet.run(config, fleet_config, host, port, log_level)
