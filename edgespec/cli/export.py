"""`edgespec export` (and the compatibility report it can run afterwards)."""

from __future__ import annotations

from typing import Any

import click

from edgespec.cli.common import ExportProgress, _friendly, _report_compat


@click.command()
@click.argument("model")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False), help="Bundle folder.")
@click.option("--draft", help="A separate draft model (same tokenizer) exported into the bundle.")
@click.option(
    "--exit-layers", default="", help="Early-exit layers for head@k/tail@k pairs, e.g. 2,4."
)
@click.option(
    "--feature-layers",
    default="",
    help="Layers whose hidden states the full graph also outputs (for a feature head, "
    "`edgespec distill`), e.g. 2,15,30.",
)
@click.option(
    "--eagle-gguf",
    type=click.Path(dir_okay=False),
    default=None,
    help="An EAGLE-3 head in llama.cpp's GGUF (as its draft-eagle3 reads) for this target, "
    "written as the bundle's feature head (--mode eagle); the features it reads are declared.",
)
@click.option("--dtype", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True)
@click.option(
    "--quantize",
    type=click.Choice(["int8", "int4", "qdq-int8"]),
    default=None,
    help="int8/int4: block-wise weights (MatMulNBits); qdq-int8: static, calibrated (NPUs).",
)
@click.option(
    "--draft-quantize",
    type=click.Choice(["int8", "int4", "none"]),
    default=None,
    help="The --draft model's weights, if not as --quantize (e.g. an fp32 target with an int8 "
    "draft: a faster draft, the same output); --eagle-gguf's float matrices (default: int8).",
)
@click.option(
    "--block-size",
    default=None,
    type=int,
    help="int8/int4 weights per scale.  [default: 128]",
)
@click.option(
    "--accuracy-level",
    default=4,
    show_default=True,
    type=click.IntRange(0, 4),
    help="int8/int4 (and a GGUF file's blocks) compute: 4 = int8 activations (fast), 0 = float.",
)
@click.option(
    "--gguf-weights",
    type=click.Choice(["blocks", "float"]),
    default="blocks",
    show_default=True,
    help="A GGUF file's quantized tensors: kept as MatMulNBits blocks, or as their exact "
    "float32 values (float compute).",
)
@click.option(
    "--batched-verify/--no-batched-verify",
    default=None,
    help="Graphs with which a verifier server batches rounds of several devices (they need "
    "onnxruntime >= 1.32); --no-batched-verify: graphs for older onnxruntime, e.g. "
    "onnxruntime-gpu 1.31.  [default: what the onnxruntime installed here loads]",
)
@click.option(
    "--tree-verify",
    is_flag=True,
    help="Also write tree-verification graphs: token-tree drafters verify every candidate "
    "in one forward.",
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
    feature_layers: str,
    eagle_gguf: str | None,
    dtype: str,
    quantize: str | None,
    draft_quantize: str | None,
    block_size: int | None,
    accuracy_level: int,
    gguf_weights: str,
    batched_verify: bool | None,
    tree_verify: bool,
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
    """Export MODEL (a local checkpoint folder, a hub id, builtin:tiny-llama, or a GGUF file)
    to a bundle."""
    try:
        from edgespec.export import ExportConfig, ExportError, export_bundle
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
        features = [int(k) for k in feature_layers.split(",") if k.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{feature_layers!r} is not a comma-separated list of layer numbers",
            param_hint="--feature-layers",
        ) from None
    try:
        widths = [int(w) for w in verify_width.split(",") if w.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{verify_width!r} is not a width or a comma-separated list of widths",
            param_hint="--verify-width",
        ) from None
    progress = ExportProgress()
    try:
        config = ExportConfig(
            draft=draft,
            exit_layers=layers,
            dtype=dtype,
            quantize=quantize,
            draft_quantize=draft_quantize,
            block_size=block_size,
            accuracy_level=accuracy_level,
            gguf_weights=gguf_weights,
            batched_verify=batched_verify,
            tree_verify=tree_verify,
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
            feature_layers=features,
            eagle_gguf=eagle_gguf,
            on_progress=progress,
        )
        manifest = export_bundle(model, out, config)
    except ExportError as e:
        raise click.ClickException(str(e)) from None
    finally:
        progress.close()
    click.echo(f"wrote {out}: {', '.join(manifest.roles)}")
    note = agreement_note(manifest)
    if note:
        click.echo(note, err=True)
    if check_compat:
        _report_compat(check_compat, out)


def agreement_note(manifest: Any) -> str | None:
    """A warning when the export check found the bundle's next-token argmax leaving the
    reference's (quantized weights or activations change the text), with what rounds closer."""
    check = manifest.extra.get("export_check") or {}
    agree = check.get("argmax_agreement")
    if agree is None or agree >= 1.0:
        return None
    return (
        f"note: the export check's next token agrees with the reference at {agree:.0%} of "
        f"positions (max logit difference {check.get('max_abs_logit_diff', float('nan')):.3g}): "
        "this bundle's greedy text will leave the float model's. For closer text: "
        "--block-size 32 with --quantize int8/int4, or float weights (no --quantize; a GGUF "
        "file's --gguf-weights float)"
    )
