"""`edgespec channel`: the network link emulator (a TCP proxy) on the command line."""

from __future__ import annotations

import click


@click.command()
@click.option("--listen", default="127.0.0.1:8701", show_default=True, help="HOST:PORT to accept.")
@click.option("--upstream", default="127.0.0.1:8700", show_default=True, help="HOST:PORT to reach.")
@click.option("--rtt-ms", default=0.0, show_default=True, type=float, help="Added round trip.")
@click.option("--bandwidth-mbit", default=None, type=float, help="Per direction (default: no cap).")
@click.option("--jitter-ms", default=0.0, show_default=True, type=float, help="± per direction.")
@click.option("--loss", default=0.0, show_default=True, type=float, help="Segment loss rate.")
@click.option("--trace", type=click.Path(), help="CSV time_s,rtt_ms,bandwidth_mbit[,loss].")
@click.option("--hold", is_flag=True, help="Hold the trace's last row instead of looping.")
@click.option("--seed", default=None, type=int, help="Seed for jitter and loss.")
def channel(
    listen: str,
    upstream: str,
    rtt_ms: float,
    bandwidth_mbit: float | None,
    jitter_ms: float,
    loss: float,
    trace: str | None,
    hold: bool,
    seed: int | None,
) -> None:
    """Emulate a network link: a TCP proxy adding delay, jitter, a bandwidth cap and loss."""
    from edgespec.tools.channel import ChannelConfig, ChannelError, Trace, run_channel

    try:
        config = ChannelConfig(rtt_ms, bandwidth_mbit, jitter_ms, loss)
        replay = Trace.from_csv(trace, loop=not hold) if trace else None
        what = f"trace {trace}" if trace else config.describe()
        run_channel(
            listen,
            upstream,
            config,
            replay,
            seed,
            ready=lambda at: click.echo(f"channel {at} -> {upstream}: {what}", err=True),
        )
    except ChannelError as e:
        raise click.ClickException(str(e)) from None
    except KeyboardInterrupt:
        click.echo("\nstopped", err=True)
