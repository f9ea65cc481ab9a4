"""`edgespec` command line: a thin layer over `edgespec.export` and `edgespec.load`.

Every expected failure (bad bundle, bad option, bad prompt, missing device) is printed as
one `Error:` line with the fix, exit status 1; never a traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import click

from edgespec import __version__
from edgespec.runtime.registry import MODES


def _friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn edgespec's own errors into a one-line message instead of a traceback."""

    @wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        from edgespec.bundle import BundleError
        from edgespec.devices import DeviceError
        from edgespec.runtime.tokenizer import TokenizerError

        expected: tuple[type[Exception], ...] = (BundleError, DeviceError, TokenizerError)
        try:
            from edgespec.runtime.model import InputError

            expected += (InputError,)
        except ImportError:
            pass
        try:
            return fn(*args, **kwargs)
        except expected as e:
            raise click.ClickException(str(e)) from None
        except KeyboardInterrupt:
            click.echo("\ninterrupted", err=True)
            sys.exit(130)

    return run


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgespec")
def main() -> None:
    """Fast, lossless on-device LLM decoding on onnxruntime."""


@main.command()
@click.argument("model")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False), help="Bundle folder.")
@click.option("--draft", help="A separate draft model (same tokenizer) exported into the bundle.")
@click.option(
    "--exit-layers", default="", help="Early-exit layers for head@k/tail@k pairs, e.g. 2,4."
)
@click.option("--dtype", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True)
@click.option(
    "--quantize",
    type=click.Choice(["int8", "int4", "qdq-int8"]),
    default=None,
    help="int8/int4: block-wise weights (MatMulNBits); qdq-int8: static, calibrated (NPUs).",
)
@click.option("--block-size", default=32, show_default=True, type=int, help="int8/int4 block.")
@click.option(
    "--accuracy-level",
    default=4,
    show_default=True,
    type=click.IntRange(0, 4),
    help="int8/int4 compute: 4 = int8 activations (fast), 0 = float.",
)
@click.option("--revision", default=None, help="Hub revision (branch, tag or commit).")
@click.option("--no-verify", is_flag=True, help="Skip the check against transformers.")
@click.option("--overwrite", is_flag=True, help="Replace an existing bundle in --out.")
@click.option("--static", is_flag=True, help="Also write fixed-shape graphs for NPUs.")
@click.option(
    "--max-context",
    default=512,
    show_default=True,
    type=int,
    help="--static/--coreml: cache positions.",
)
@click.option(
    "--verify-width",
    default="8",
    show_default=True,
    help="--static/--coreml: positions per call; several (1,8) give a graph set per width.",
)
@click.option(
    "--coreml", is_flag=True, help="Also convert to Core ML packages (needs [coreml] extra)."
)
@click.option(
    "--variant",
    type=click.Choice(["standard", "shared-backbone"]),
    default="standard",
    show_default=True,
    help="shared-backbone: an edge bundle holding only a frozen draft (head@K) for split mode.",
)
@click.option("--backbone-layers", type=int, default=None, help="shared-backbone: layers K.")
@click.option(
    "--fit-exit-adapter",
    type=click.Path(dir_okay=False),
    default=None,
    help="Fit an exit adapter into each head@K on this calibration text file.",
)
@click.option("--adapter-steps", type=click.IntRange(1), default=300, show_default=True)
@click.option(
    "--check-compat",
    type=click.Path(),
    default=None,
    help="After export, report whether this edge bundle can draft for the new bundle.",
)
@_friendly
def export(
    model: str,
    out: str,
    draft: str | None,
    exit_layers: str,
    dtype: str,
    quantize: str | None,
    block_size: int,
    accuracy_level: int,
    revision: str | None,
    no_verify: bool,
    overwrite: bool,
    static: bool,
    max_context: int,
    verify_width: str,
    coreml: bool,
    variant: str,
    backbone_layers: int | None,
    fit_exit_adapter: str | None,
    adapter_steps: int,
    check_compat: str | None,
) -> None:
    """Export MODEL (a local checkpoint folder, a hub id, or builtin:tiny-llama) to a bundle."""
    try:
        from edgespec.export import ExportError, export_bundle
    except ImportError as e:
        raise click.ClickException(
            f"export needs the [export] extra ({e.name} is missing): pip install 'edgespec[export]'"
        ) from None
    try:
        layers = [int(k) for k in exit_layers.split(",") if k.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{exit_layers!r} is not a comma-separated list of layer numbers",
            param_hint="--exit-layers",
        ) from None
    try:
        widths = [int(w) for w in verify_width.split(",") if w.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{verify_width!r} is not a width or a comma-separated list of widths",
            param_hint="--verify-width",
        ) from None
    try:
        manifest = export_bundle(
            model,
            out,
            draft=draft,
            exit_layers=layers,
            dtype=dtype,
            quantize=quantize,
            block_size=block_size,
            accuracy_level=accuracy_level,
            revision=revision,
            verify=not no_verify,
            overwrite=overwrite,
            static=static,
            max_context=max_context,
            verify_width=widths,
            coreml=coreml,
            variant=variant,
            backbone_layers=backbone_layers,
            fit_exit_adapter=fit_exit_adapter,
            adapter_steps=adapter_steps,
        )
    except ExportError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"wrote {out}: {', '.join(manifest.roles)}")
    if check_compat:
        _report_compat(check_compat, out)


def _report_compat(edge: str, cloud: str) -> None:
    """One line: can EDGE's frozen draft run against CLOUD's target; exit 1 when not."""
    from edgespec.backbone import compatibility
    from edgespec.bundle import load_manifest

    ok, reason = compatibility(load_manifest(edge), load_manifest(cloud))
    click.echo(f"{'compatible' if ok else 'INCOMPATIBLE'}: {edge} -> {cloud}: {reason}")
    if not ok:
        sys.exit(1)


@main.command()
@click.argument("bundle", type=click.Path())
@click.option("--prompt", "-p", required=True, help="Prompt text.")
@click.option("--max-new-tokens", "-n", default=128, show_default=True, type=int)
@click.option("--temperature", "-t", default=0.0, show_default=True, type=float, help="0 = greedy.")
@click.option("--top-p", default=1.0, show_default=True, type=float)
@click.option("--top-k", default=0, show_default=True, type=int, help="0 = off.")
@click.option("--seed", default=None, type=int, help="Seed for sampling.")
@click.option("--stream/--no-stream", default=True, show_default=True, help="Print as produced.")
@click.option("--stats", is_flag=True, help="Print speed and speculation stats to stderr.")
@click.option(
    "--device",
    default="cpu",
    show_default=True,
    help="A device profile (`edgespec devices`: cpu, cuda, dml, openvino, ...) or auto.",
)
@click.option("--threads", default=None, type=int, help="Intra-op threads (default: all cores).")
@click.option("--ignore-eos", is_flag=True, help="Keep going past end-of-sequence tokens.")
@click.option(
    "--mode",
    type=click.Choice(MODES),
    default="ar",
    show_default=True,
    help="ar, spec (draft model), self-spec (early exit), lookup (prompt lookup), "
    "split (draft here, verify on --server).",
)
@click.option(
    "--draft-policy",
    default=None,
    help="fixed:N | confidence:T | acceptance | auto | dynamic-exit (default auto).",
)
@click.option("--exit-layer", default=None, type=int, help="Exit layer for self-spec.")
@click.option(
    "--drafter",
    default=None,
    help="draft | exit:K | lookup, or a chain such as lookup+draft (default: the mode's).",
)
@click.option("--verifier", default=None, help="full | exit:K (local modes; default full).")
@click.option("--server", default=None, help="split: the verifier server, ws://HOST:PORT.")
@click.option("--token-file", default=None, type=click.Path(), help="split: bearer token file.")
@click.option("--energy-budget", default=None, type=float, help="split: joules per token.")
@click.option("--timeout", default=None, type=float, help="split: seconds per answer [10].")
@click.option("--static", is_flag=True, help="Run the bundle's fixed-shape (NPU) graphs.")
@click.option("--coreml", is_flag=True, help="Run the bundle's Core ML packages (macOS 15+).")
@_friendly
def generate(bundle: str, prompt: str, max_new_tokens: int, **options: Any) -> None:
    """Generate text from BUNDLE."""
    from edgespec.runtime.config import LoadConfig
    from edgespec.runtime.model import Model

    sampling = {k: options.pop(k) for k in ("temperature", "top_p", "top_k", "seed", "ignore_eos")}
    stream, stats = options.pop("stream"), options.pop("stats")
    options["token"] = _read_token(options.pop("token_file"))
    if options["timeout"] is None:
        options.pop("timeout")  # the library's default
    model = Model.load(bundle, LoadConfig.from_options(**options))
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


def format_stats(s: Any, finish: str, split: bool = False) -> str:
    line = (
        f"prefill: {s.prompt_tokens} tokens, {s.prefill_tokens_per_s:.1f} tok/s | "
        f"decode: {s.decode_tokens} tokens, {s.decode_tokens_per_s:.1f} tok/s | finish: {finish}"
    )
    if split:
        line += (
            f"\nsplit: {s.remote_rounds} rounds verified by the server, {s.local_rounds} locally"
            + (" (server unreachable: continued on the local verifier)" if s.local_rounds else "")
            + f" | network {s.network_seconds:.2f}s, server {s.server_seconds:.2f}s | "
            f"{s.bytes_up} B up, {s.bytes_down} B down"
        )
    if s.drafted:
        lengths = " ".join(f"{k}:{v}" for k, v in sorted(s.accepted_lengths.items()))
        line += (
            f"\nspeculation: {s.rounds} rounds, drafted {s.drafted}, accepted {s.accepted} "
            f"({s.acceptance_rate:.0%}), mean accepted {s.mean_accepted:.2f}/round, "
            f"drafting {s.draft_seconds:.2f}s vs verifying {s.verify_seconds:.2f}s | "
            f"accepted-length histogram {lengths}"
        )
    return line


@main.command()
@click.option("--prompt", "-p", default=None, help="Code to continue (default: a def line).")
@click.option("--max-new-tokens", "-n", default=128, show_default=True, type=int)
@click.option("--threads", default=None, type=int)
@_friendly
def demo(prompt: str | None, max_new_tokens: int, threads: int | None) -> None:
    """Run the built-in trained code model: plain vs speculative decoding, side by side."""
    from edgespec.demo import DemoConfig, run_demo

    given = {"prompt": prompt} if prompt is not None else {}
    config = DemoConfig(max_new_tokens=max_new_tokens, threads=threads, **given)
    rows = run_demo(config, progress=lambda m: click.echo(f"decoding with {m} ...", err=True))
    click.echo(format_demo(config.prompt, rows))


def format_demo(prompt: str, rows: list[Any]) -> str:
    """The prompt and ar's output, then one line per mode: tok/s, speed-up, same text."""
    best = max(rows[1:], key=lambda r: r.tokens_per_s, default=rows[0])
    lines = [
        "built-in model: 11M-parameter Llama trained on Python's stdlib (int8), greedy",
        "", click.style(prompt, bold=True) + rows[0].text, "",
        f"{'mode':<13}{'tokens/s':>10}{'speed-up':>10}{'tokens/call':>13}  same text as ar",
    ]  # fmt: skip
    for r in rows:
        mark = " <- best" if r is best and r is not rows[0] else ""
        same = "yes" if r.same_as_ar else "NO (a bug: please report it)"
        lines.append(
            f"{r.mode:<13}{r.tokens_per_s:>10.0f}{r.speedup:>9.2f}x{r.tokens_per_round:>13.2f}"
            f"  {same}{mark}"
        )
    return "\n".join(lines)


@main.command()
@click.argument("bundle", type=click.Path())
@click.option("--calibrate", is_flag=True, help="Measure round costs; store calibration.json.")
@click.option("--prompt", "-p", default="def fibonacci(n):\n", show_default=True)
@click.option("--max-new-tokens", "-n", default=64, show_default=True, type=int)
@click.option("--device", default="cpu", show_default=True, help="A device profile or auto.")
@click.option("--threads", default=None, type=int)
@_friendly
def bench(
    bundle: str,
    calibrate: bool,
    prompt: str,
    max_new_tokens: int,
    device: str,
    threads: int | None,
) -> None:
    """Time each decoding mode BUNDLE supports on one prompt, or --calibrate this device."""
    import edgespec
    from edgespec.runtime.calibrate import calibrate as run_calibration
    from edgespec.runtime.calibrate import device_key, mode_keys

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
        return
    ar = edgespec.load(bundle, device=device, threads=threads)
    rows = [("ar", ar)] + [
        (key, edgespec.load(bundle, device=device, threads=threads, **options))
        for key, options in mode_keys(ar.manifest)
    ]
    click.echo(f"{'mode':<14} {'tok/s':>8} {'vs ar':>7} {'accepted':>9}  output equals ar")
    reference, base = None, None
    for key, model in rows:
        model.generate(prompt, max_new_tokens=4, ignore_eos=True)  # warm-up
        out = model.generate(prompt, max_new_tokens=max_new_tokens, ignore_eos=True)
        s = out.stats
        rate = len(out.tokens) / (s.prefill_seconds + s.decode_seconds)
        reference, base = reference or out.tokens, base or rate
        click.echo(
            f"{key:<14} {rate:>8.1f} {rate / base:>6.2f}x {s.acceptance_rate:>8.0%}  "
            f"{out.tokens == reference}"
        )


@main.command()
@click.argument("bundle", type=click.Path(), required=False)
@click.option(
    "--compat",
    nargs=2,
    type=click.Path(),
    default=None,
    metavar="EDGE CLOUD",
    help="Whether shared-backbone bundle EDGE can draft for CLOUD's target (exit 1 if not).",
)
@_friendly
def inspect(bundle: str | None, compat: tuple[str, str] | None) -> None:
    """Show what a bundle holds (or, with --compat EDGE CLOUD, whether two bundles fit)."""
    from edgespec.bundle import load_manifest

    if compat:
        _report_compat(*compat)
        return
    if bundle is None:
        raise click.UsageError("give a BUNDLE folder, or --compat EDGE CLOUD")
    m = load_manifest(bundle)
    t = m.target
    rows = [
        (
            "source",
            f"{m.source['model']}"
            + (f" @ {m.source['revision']}" if m.source.get("revision") else ""),
        ),
        ("architecture", f"{t.architecture} ({t.model_type})"),
        ("layers / hidden", f"{t.num_layers} / {t.hidden_size}"),
        ("heads / kv heads / head dim", f"{t.num_heads} / {t.num_kv_heads} / {t.head_dim}"),
        ("vocab / context", f"{t.vocab_size} / {t.max_position_embeddings}"),
        ("tied embeddings", str(t.tie_word_embeddings)),
        ("dtype / quantization", f"{m.dtype} / {m.quantization or 'none'}" + _quant_details(m)),
        ("tokenizer", ", ".join(m.tokenizer_files)),
        ("bos / eos", f"{m.bos_token_id} / {m.eos_token_ids}"),
        ("backbone fingerprint", m.backbone_fingerprint[:23] + "..."),
        ("schema / made by", f"{m.schema_version} / {m.created_by}"),
    ]
    if m.draft:
        d = m.draft
        rows.append(
            (
                "draft",
                f"{m.draft_source and m.draft_source['model']}: {d.num_layers} layers, "
                f"hidden {d.hidden_size}",
            )
        )
    if m.variant != "standard":
        rows.append(("variant", f"{m.variant}, backbone layers {m.backbone_layers}"))
    for k, a in m.extra.get("exit_adapters", {}).items():
        rows.append(
            (
                f"exit adapter @{k}",
                f"{a['kind']}: KL to final {a['kl_before']:.3f} -> {a['kl_after']:.3f}, "
                f"top-1 {a['top1_before']:.0%} -> {a['top1_after']:.0%}",
            )
        )
    if "max_abs_logit_diff" in m.extra.get("export_check", {}):
        c = m.extra["export_check"]
        rows.append(
            (
                "export check",
                f"max |logit diff| {c['max_abs_logit_diff']:.2e}, "
                f"argmax agreement {c['argmax_agreement']:.0%}",
            )
        )
    if m.static is not None:
        rows.append(
            (
                "static graphs (NPU)",
                f"max context {m.static.max_context}, verify widths "
                f"{', '.join(map(str, m.static.verify_widths))}: "
                + ", ".join(dict.fromkeys(g.role for g in m.static.graphs)),
            )
        )
    if m.coreml is not None:
        rows.append(
            (
                "Core ML packages",
                f"max context {m.coreml.max_context}, verify width {m.coreml.verify_width}: "
                + ", ".join(p.role for p in m.coreml.packages),
            )
        )
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        click.echo(f"{k:<{width}}  {v}")
    click.echo("")
    folder = Path(bundle)
    header = f"{'role':<10} {'file':<16} {'layers':<8} {'MiB':>8}  inputs"
    click.echo(header)
    click.echo("-" * len(header))
    for g in m.graphs:
        size = (folder / g.file).stat().st_size / 2**20
        layers = f"{g.kv_layers[0]}-{g.kv_layers[-1]}" if g.kv_layers else "-"
        inputs = ", ".join(i.name for i in g.inputs if not i.name.startswith("past_"))
        click.echo(f"{g.role:<10} {g.file:<16} {layers:<8} {size:>8.2f}  {inputs}, past KV")
    weights = (folder / m.weights_file).stat().st_size / 2**20
    click.echo(f"{'weights':<10} {m.weights_file:<16} {'shared':<8} {weights:>8.1f}")


def _quant_details(m: Any) -> str:
    details = m.extra.get("quantization") or {}
    shown = ", ".join(f"{k} {v}" for k, v in details.items() if k != "method")
    return f" ({shown})" if shown else ""


def _read_token(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise click.BadParameter(
            f"cannot read {path}: {e.strerror}", param_hint="--token-file"
        ) from None
    if not token:
        raise click.BadParameter(f"{path} is empty", param_hint="--token-file")
    return token


@main.command()
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
@click.option("--log-level", default="info", show_default=True)
@_friendly
def serve(bundle: str, host: str, port: int, token_file: str | None, log_level: str, **limits):
    """Serve BUNDLE's target as the verifier of split decoding (and /v1/completions)."""
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


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the profiles as JSON.")
@_friendly
def devices(as_json: bool) -> None:
    """List this onnxruntime build's execution providers and every device profile."""
    import json

    import onnxruntime as ort

    from edgespec.devices.profiles import load_profiles, user_dirs

    providers = ort.get_available_providers()
    profiles = load_profiles()
    if as_json:
        rows = [p.to_dict() | {"available": p.available()} for p in profiles.values()]
        doc = {"onnxruntime": ort.__version__, "providers": providers, "profiles": rows}
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"onnxruntime {ort.__version__}: {', '.join(providers)}")
    click.echo(f"user profiles: {os.pathsep.join(str(d) for d in user_dirs())}\n")
    header = (
        f"{'device':<13} {'here':<5} {'static':<6} {'quant':<8} {'GB/s':>5}  "
        "energy; providers (options)"
    )
    click.echo(header)
    click.echo("-" * len(header))
    for p in profiles.values():
        energy = ", ".join(f"{k}={v:g}" for k, v in p.energy.items()) or "defaults"
        chain = " > ".join(
            name.removesuffix("ExecutionProvider")
            + (" (" + ", ".join(f"{k}={v}" for k, v in opts.items()) + ")" if opts else "")
            for name, opts in p.providers
        )
        bandwidth = f"{p.memory_bandwidth_gbps:g}" if p.memory_bandwidth_gbps else "-"
        click.echo(
            f"{p.name:<13} {'yes' if p.available() else 'no':<5} "
            f"{'yes' if p.static_shapes else 'no':<6} {p.quantization:<8} {bandwidth:>5}  "
            f"{energy}; {chain}" + ("" if p.source == "built-in" else f"  [{p.source}]")
        )


@main.command()
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
    from edgespec.channel import ChannelConfig, ChannelError, Trace, run_channel

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


if __name__ == "__main__":
    main()
