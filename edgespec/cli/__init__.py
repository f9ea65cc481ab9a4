"""`edgespec` command line: a thin layer over `edgespec.export` and `edgespec.load`.

Every expected failure (bad bundle, bad option, bad prompt, missing device) is printed as
one `Error:` line with the fix, exit status 1; never a traceback.

This module holds the `main` click group and names one module per command group:
export.py, distill.py, generate.py (generate, demo, bench), chat.py, inspect.py, serve.py,
devices.py, channel.py; what they share (errors, token file, stats lines, export progress) is
common.py, which imports none of them, so nothing here imports in a circle. A command's
module is imported when that command runs (or its help is shown), and the command modules
import the runtime only inside the commands: `edgespec --help`, a command's `--help` and a
bad flag are answered without loading numpy or onnxruntime.
"""

from __future__ import annotations

import importlib

import click

from edgespec import __version__

__all__ = ["main"]

# command name -> the module (under edgespec.cli) that defines it, in the order of --help
COMMANDS: dict[str, str] = {
    "export": "export",
    "distill": "distill",
    "generate": "generate",
    "demo": "generate",
    "bench": "generate",
    "chat": "chat",
    "inspect": "inspect",
    "serve": "serve",
    "devices": "devices",
    "channel": "channel",
}


class LazyGroup(click.Group):
    """A group whose commands are imported when they are asked for (click's lazy group)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*COMMANDS, *super().list_commands(ctx)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        module = importlib.import_module(f"edgespec.cli.{COMMANDS[cmd_name]}")
        command = getattr(module, cmd_name)
        assert isinstance(command, click.Command), f"edgespec.cli.{cmd_name} is not a command"
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgespec")
def main() -> None:
    """Fast, lossless on-device LLM decoding on onnxruntime."""
