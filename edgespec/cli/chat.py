"""`edgespec chat BUNDLE`: talk to a bundle in the terminal.

Takes a bundle with a chat template and the decoding-mode flags of `generate`; runs a
read-reply loop over one `ChatSession` (each turn prefills only what is new), streaming
replies as they are decoded. Commands: /reset (new conversation), /stats (speed and
speculation of the last reply), /help, /exit (or Ctrl-D). Ctrl-C stops a reply, not the chat.
"""

from __future__ import annotations

import json
import sys
from time import perf_counter
from typing import Any

import click

from edgespec.cli.common import _friendly, decoding_options, load_config

HELP = "/reset  new conversation   /stats  last reply's speed   /help   /exit (or Ctrl-D)"


def _flags(pairs: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise click.BadParameter(f"{pair!r}: write KEY=VALUE, e.g. enable_thinking=false")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value  # a bare word is a string
    return out


@click.command()
@click.argument("bundle", type=click.Path())
@click.option("--system", "-s", default=None, help="A system message for the conversation.")
@click.option("--max-new-tokens", "-n", default=256, show_default=True, type=int)
@click.option(
    "--temperature",
    "-t",
    default=None,
    type=float,
    help="0 = greedy (default: the bundle's generation config, else greedy).",
)
@click.option("--top-p", default=None, type=float)
@click.option("--top-k", default=None, type=int)
@click.option("--seed", default=None, type=int, help="Seed for sampling.")
@click.option("--stop", multiple=True, help="A stop string (repeatable).")
@click.option(
    "--flag",
    "flags",
    multiple=True,
    help="A chat template variable, KEY=VALUE (JSON), e.g. enable_thinking=false.",
)
@click.option(
    "--truncation",
    type=click.Choice(["error", "drop-oldest"]),
    default="error",
    show_default=True,
    help="What to do when the conversation outgrows the context.",
)
@decoding_options
@_friendly
def chat(bundle: str, system: str | None, **options: Any) -> None:
    """Chat with BUNDLE in the terminal (needs a bundle exported with a chat template)."""
    from edgespec.runtime.chat.session import ChatOptions
    from edgespec.runtime.chat.template import ChatTemplate
    from edgespec.runtime.model import Model

    reply_keys = ("max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop", "truncation")
    reply = {k: options.pop(k) for k in reply_keys}
    reply["flags"] = _flags(options.pop("flags"))
    chat_options = ChatOptions(**reply)
    model = Model.load(bundle, load_config(options))
    ChatTemplate.from_bundle(model.folder, model.manifest)  # no template: say so now
    session = model.chat_session(system=system)
    interactive = sys.stdin.isatty()
    if interactive:
        click.echo(f"edgespec chat — {bundle} ({model.mode}). {HELP}", err=True)
    last: tuple[float, float] | None = None  # (time to first token, seconds) of the last reply
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            click.echo("")
            return
        except KeyboardInterrupt:
            click.echo("")
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return
        if text == "/help":
            click.echo(HELP)
            continue
        if text == "/reset":
            session.reset()
            last = None
            click.echo("(new conversation)")
            continue
        if text == "/stats":
            click.echo(_stats(session.last, last))
            continue
        if text.startswith("/"):
            click.echo(f"unknown command {text.split()[0]}; {HELP}")
            continue
        start, first = perf_counter(), None
        try:
            for chunk in session.say(line, chat_options):
                if first is None:
                    first = perf_counter() - start
                click.echo(chunk.text, nl=False)
            click.echo("")
            last = (first or 0.0, perf_counter() - start)
        except KeyboardInterrupt:
            click.echo("\n(reply stopped)")


def _stats(reply: Any, times: tuple[float, float] | None) -> str:
    if reply is None or times is None:
        return "(no reply yet)"
    s = reply.stats
    ttft, seconds = times
    line = (
        f"last reply: {len(reply.tokens)} tokens in {seconds:.2f}s, "
        f"{s.decode_tokens_per_s:.1f} tok/s decoding, first token after {ttft * 1000:.0f} ms | "
        f"prompt {reply.prompt_tokens} tokens, {reply.cached_tokens} cached, "
        f"{s.prefill_tokens} prefilled | finish: {reply.finish_reason}"
    )
    if s.drafted:
        line += (
            f"\nspeculation: {s.rounds} rounds, drafted {s.drafted}, accepted {s.accepted} "
            f"({s.acceptance_rate:.0%}), mean accepted {s.mean_accepted:.2f}/round"
        )
    else:
        line += "\nspeculation: none (nothing drafted)"
    return line
