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
@click.option("--log-level", default="info", show_default=True)
@_friendly
def serve(bundle: str, host: str, port: int, token_file: str | None, log_level: str, **limits):
    """Serve BUNDLE's target as the verifier of split decoding (and /v1/completions)."""
    try:
        from edgespec.serve.server import ConfigError, ServerConfig, run
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
    run(config, host, port, log_level)
