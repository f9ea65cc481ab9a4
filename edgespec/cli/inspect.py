"""`edgespec inspect`: what a bundle holds, or whether two bundles fit (--compat)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from edgespec.cli.common import _friendly, _report_compat


@click.command()
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
        (
            "dtype / quantization",
            f"{m.dtype} / {m.quantization or 'none'}" + _quant_details(m.extra.get("quantization")),
        ),
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
        if "draft_quantization" in m.extra:  # quantized apart from the target
            q = m.extra["draft_quantization"]
            rows.append(("draft quantization", q["method"] + _quant_details(q)))
    rows += _chat_rows(m, Path(bundle))
    rows += _gguf_rows(m.extra.get("gguf"))
    rows += _head_rows(m)
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
        against = f" (vs {c['reference']})" if "reference" in c else ""
        rows.append(
            (
                "export check" + against,
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
    if m.tree_graphs:
        roles = ", ".join(g.role for g in m.tree_graphs)
        rows.append(("token trees", f"verified in one forward: {roles}"))
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


def _gguf_rows(g: dict | None) -> list[tuple[str, str]]:
    """Where each part of a bundle imported from a GGUF file came from."""
    if not g:
        return []
    rows = [
        (
            "imported from GGUF",
            f"{g['file']} ({g['name']}, general.architecture="
            f"{g['architecture']}, general.file_type={g['file_type']})",
        )
    ]
    rows.append(("  config", g["config"]))
    for how, n in g["weights"].items():
        rows.append(("  weights", f"{n} tensors: {how}"))
    for name, e in g.get("requantized", {}).items():
        rows.append(
            (
                "  re-quantized",
                f"{name}: max abs error {e['max_abs_error']:.3g}, "
                f"relative RMS {e['relative_rms_error']:.3g}",
            )
        )
    rows.append(("  tokenizer", g["tokenizer"]))
    rows.append(("  chat template", g["chat_template"] or "none in the file"))
    return rows  # fmt: skip


def _chat_rows(m: Any, folder: Path) -> list[tuple[str, str]]:
    """inspect: the chat template(s) and generation defaults the bundle carries."""
    if m.chat is None:
        return [("chat template", "none (a base model: chat needs a template; generate works)")]
    rows = []
    for name, rel in m.chat.templates.items():
        text = (folder / rel).read_text(encoding="utf-8")
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
        rows.append((f"chat template {name}", f"{rel} ({len(text)} chars): {first[:60]}"))
    tokens = ", ".join(f"{k}={v!r}" for k, v in m.chat.special_tokens.items())
    rows.append(("chat special tokens", tokens or "none"))
    gen = ", ".join(f"{k}={v}" for k, v in m.chat.generation.items())
    rows.append(("generation defaults", gen or "none set (greedy)"))
    return rows


def _quant_details(details: dict | None) -> str:
    details = details or {}
    shown = ", ".join(f"{k} {v}" for k, v in details.items() if k != "method")
    return f" ({shown})" if shown else ""


def _head_rows(m: Any) -> list[tuple[str, str]]:
    """The feature head: where it came from, what it reads, what decoding with it measured."""
    if "eagle" not in m.roles:
        return []
    record = m.extra.get("eagle") or {}
    layers = ", ".join(map(str, m.feature_layers))
    imported = record.get("imported")
    if imported:
        q = imported.get("quantize", "none")
        what = (f"{imported.get('file')} (llama.cpp EAGLE-3), target layers "
                f"{imported.get('target_layers')}, draft vocab {imported.get('draft_vocab')}, "
                f"{'float' if q == 'none' else q} weights")  # fmt: skip
    else:
        held = record.get("held_out", {})
        what = (f"distilled, {record.get('steps', '?')} steps; held-out drafts kept per round "
                f"at γ=4: {held.get('accepted', 0):.2f}")  # fmt: skip
        if "draft_vocab" in record:
            what += (f"; draft vocab {record['draft_vocab']} "
                     f"({record.get('coverage', 0):.1%} of held-out reply tokens)")  # fmt: skip
    rows = [("feature head", f"{what}; features of layers {layers}")]
    measured = record.get("decode_speedup")
    if measured:
        rows.append(("decoding, x ar", ", ".join(f"{k} {x:.2f}" for k, x in measured.items())))
    return rows
