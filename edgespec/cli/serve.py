"""`edgespec serve`: the verifier server of split decoding (needs the [serve] extra)."""

from __future__ import annotations

import click

from edgespec.cli.common import _friendly, _read_token


@click.command()
@click.argument("bundle", type=click.Path())
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8700, show_default=True, type=int)
@click.option("--token-file", default=None, type=click.Path(), help="Require this bearer token.")
@click.option("--max-sessions", default=16, show_default=True, type=click.IntRange(1))
@click.option("--max-context", default=None, type=click.IntRange(2), help="Positions per session.")
@click.option("--max-request-bytes", default=1 << 20, show_default=True, type=click.IntRange(64))
@click.option("--idle-timeout", default=300.0, show_default=True, help="Seconds; frees the cache.")
@click.option("--threads", default=None, type=int, help="Intra-op threads (default: all cores).")
@click.option(
    "--max-batch",
    default=16,
    show_default=True,
    type=click.IntRange(1),
    help="Verify rounds batched together (1: each round alone).",
)
@click.option(
    "--batch-window-ms",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0, 1000),
    help="Wait this long for more rounds when a batch is not full (adds latency when idle).",
)
@click.option("--device", default="cpu", show_default=True, help="A device profile or auto.")
@click.option(
    "--mode",
    type=click.Choice(["ar", "spec", "self-spec", "lookup"]),
    default=None,
    help="How the OpenAI endpoints decode (default: the fastest the bundle supports: spec if "
    "it has a draft model, else self-spec, else lookup; the auto policy speculates only while "
    "it wins).",
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
@click.option("--log-level", default="info", show_default=True)
@_friendly
def serve(bundle: str, host: str, port: int, token_file: str | None, log_level: str, **limits):
    """Serve BUNDLE: the verifier of split decoding and the OpenAI API (/v1/chat/completions)."""
    try:
        from edgespec.serve.server import ServerConfig, run
    except ImportError as e:
        raise click.ClickException(
            f"serve needs the [serve] extra ({e.name} is missing): pip install 'edgespec[serve]'"
        ) from None
    token = _read_token(token_file)
    if token is None and host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"warning: serving on {host} without --token-file: anyone can connect", err=True)
    run(ServerConfig(bundle, token, **limits), host, port, log_level)
