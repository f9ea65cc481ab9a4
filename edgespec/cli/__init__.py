"""`edgespec` command line: a thin layer over `edgespec.export` and `edgespec.load`.

Every expected failure (bad bundle, bad option, bad prompt, missing device) is printed as
one `Error:` line with the fix, exit status 1; never a traceback.

This module holds the `main` click group and registers one module per command group:
export.py, generate.py (generate, demo, bench), chat.py, inspect.py, serve.py, devices.py,
channel.py; what they share (errors, token file, stats lines, export progress) is
common.py, which imports none of them, so nothing here imports in a circle.
"""

from __future__ import annotations

import click

from edgespec import __version__
from edgespec.cli import channel, chat, devices, export, generate, inspect, serve
from edgespec.cli.common import _friendly, _read_token, format_stats

__all__ = ["main", "format_stats", "_friendly", "_read_token"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgespec")
def main() -> None:
    """Fast, lossless on-device LLM decoding on onnxruntime."""


for command in (
    export.export,
    generate.generate,
    generate.demo,
    generate.bench,
    chat.chat,
    inspect.inspect,
    serve.serve,
    devices.devices,
    channel.channel,
):
    main.add_command(command)
