"""The export pipeline: a Hugging Face checkpoint -> an edgespec bundle folder.

`export_bundle(model, out, config)` takes a local checkpoint folder, a hub id, a
`builtin:` name or a GGUF file (handed to gguf_export.py, which needs no torch) plus, per
`ExportConfig`, an optional separate draft model and early-exit layers; it writes the ONNX
graphs of each role, the tokenizer files, one shared weights file and `manifest.json`, and
checks the exported `full` graph against the transformers model before it returns. Every
user mistake is an `ExportError` saying what is wrong and what to
do, raised before the output folder is touched where it can be.

`variant="shared-backbone", backbone_layers=k` writes an edge bundle instead: only head@k
(the target's embeddings and lower k layers, final norm and LM head, plus an exit adapter
with `fit_exit_adapter`), a frozen draft for split decoding against any target that keeps
those layers and the tokenizer (see `edgespec.backbone`). `fit_exit_adapter=CALIB.txt`
fits an adapter into every head@k (`exit_adapter.py`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from edgespec import __version__
from edgespec.bundle import (
    CoreMLVariants,
    GraphInfo,
    Manifest,
    StaticVariants,
    save_manifest,
)
from edgespec.export.builder import WeightStore
from edgespec.export.chat_format import save_chat_format
from edgespec.export.config import DTYPES, ExportConfig
from edgespec.export.eagle_gguf import ImportedHead
from edgespec.export.errors import ExportError
from edgespec.export.exit_adapter import fit_exit_adapters
from edgespec.export.gguf_export import export_gguf, is_gguf
from edgespec.export.hf import (
    backbone_fingerprint,
    calibration_ids,
    check_same_tokenizer,
    extract,
    load_checkpoint,
    model_info,
    save_tokenizer,
    special_ids,
)
from edgespec.export.quantize import QdqCalibration
from edgespec.export.shared_backbone import backbone_record, verify_head
from edgespec.export.sink import WEIGHTS_FILE, GraphSink, _check_out, _prepare_out
from edgespec.export.static_bundle import static_shapes, write_static_graph
from edgespec.export.verify import verify_export, verify_static

OPTIONS = frozenset(f.name for f in dataclasses.fields(ExportConfig) if f.init)


def export_bundle(
    model: str | Path,
    out: str | Path,
    config: ExportConfig | None = None,
    **options: Any,
) -> Manifest:
    """Export `model` (and `config.draft`) to an edgespec bundle in `out`; return its manifest.

    `config` says what to build (`ExportConfig`); keyword `options` are its fields, applied
    on top of it (or of the defaults): `export_bundle(m, out, exit_layers=[2], dtype="fp16")`.
    """
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        hint = (
            " (the library does not print: pass on_progress=callable to see the steps)"
            if "progress" in unknown
            else ""
        )
        raise TypeError(
            f"export_bundle() got unknown option(s) {', '.join(unknown)}; the options are "
            f"ExportConfig's fields: {', '.join(sorted(OPTIONS))}{hint}"
        )
    if config is None:
        c = ExportConfig(**options)
    else:
        c = dataclasses.replace(config, **options) if options else config
    if is_gguf(model):
        return export_gguf(model, out, c)
    out = Path(out)
    _check_out(out, c.overwrite)  # refused before the (slow) load; written only after it
    steps = c.on_progress or _quiet
    steps("loading " + str(model))
    target, tokenizer = load_checkpoint(model, c.revision)
    info = model_info(target)
    for k in c.exit_layers:
        if not 0 < k < info.num_layers:
            option = "--backbone-layers" if c.variant == "shared-backbone" else "--exit-layers"
            raise ExportError(
                f"{option} {k} is out of range: the model has {info.num_layers} layers, "
                f"so an exit layer must be between 1 and {info.num_layers - 1}"
            )
    steps("extracting weights")
    weights = extract(target)
    imported = None
    if c.eagle_gguf is not None:  # read and checked before any file is written
        steps(f"reading the EAGLE-3 head {c.eagle_gguf}")
        imported = ImportedHead(c, weights, info.num_layers)
        c = dataclasses.replace(c, feature_layers=imported.layers)
    c.check_feature_layers(info.num_layers)
    draft_model = draft_info = None
    if c.draft is not None:
        steps("loading draft " + str(c.draft))
        draft_model, draft_tok = load_checkpoint(c.draft, None)
        check_same_tokenizer(tokenizer, draft_tok, model, c.draft)
        draft_info = model_info(draft_model)
    if c.coreml:
        try:
            import coremltools  # noqa: F401
        except ImportError as e:
            raise ExportError(
                f"--coreml needs coremltools ({e}): pip install 'edgespec[coreml]'"
            ) from None
    widths = sorted({c.verify_width} if isinstance(c.verify_width, int) else set(c.verify_width))
    shapes = []
    if c.static or c.coreml:
        try:
            quantized = [q.method for q in (c.quant, c.draft_quant) if q is not None]
            shapes = static_shapes(c.max_context, widths, quantized, [info, draft_info])
        except ValueError as e:
            raise ExportError(str(e)) from None
    _prepare_out(out, c.overwrite)  # a refused checkpoint or option leaves no folder behind

    if c.feature_layers:
        weights = dataclasses.replace(weights, feature_layers=tuple(c.feature_layers))
    adapters = {}
    if c.fit_exit_adapter is not None:  # before any file is written: bad text fails cleanly
        steps("fitting exit adapters")
        adapters = fit_exit_adapters(
            target, tokenizer, weights, sorted(set(c.exit_layers)), c.fit_exit_adapter,
            steps=c.adapter_steps, on_progress=c.on_progress,
        )  # fmt: skip
    store = WeightStore(out / WEIGHTS_FILE)
    graphs: list[GraphInfo] = []
    static_graphs: list[GraphInfo] = []
    tree_graphs: list[GraphInfo] = []
    packages = []
    qdq = None
    sink = GraphSink(out, store, c.dtype, batched=bool(c.batched_verify))
    if c.quant is not None and c.quant.method == "qdq-int8":
        qdq = QdqCalibration(calibration_ids(tokenizer, c.quant.calibration_prompts, info))
    try:
        roles = ["full"] + [
            f"{kind}@{k}" for k in sorted(set(c.exit_layers)) for kind in ("head", "tail")
        ]
        if c.variant == "shared-backbone":
            roles = [f"head@{c.backbone_layers}"]
        for role in roles:
            steps(f"building {role} graph")
            graphs.append(sink.write(weights, role, "target", c.quant, qdq))
        for role in roles if c.tree_verify else []:
            steps(f"building {role} tree-verification graph")
            tree_graphs.append(sink.write(weights, role, "target", c.quant, qdq, tree=True))
        if draft_model is not None:
            steps("building draft graph")
            draft_weights = extract(draft_model, prefix="draft.")
            if qdq is not None:  # the draft's own hidden states
                qdq = QdqCalibration(qdq.prompt_ids)
            dq = c.draft_quant
            graphs.append(sink.write(draft_weights, "draft", "draft", dq, qdq))
        if c.coreml:
            from edgespec.export.coreml import write_coreml_package  # needs coremltools

            for g in graphs:
                steps(f"converting {g.role} to Core ML")
                w = draft_weights if g.model == "draft" else weights
                packages.append(write_coreml_package(w, g.role, g.model, out, shapes[-1]))
        for shape in shapes if c.static else []:
            for g in graphs:
                steps(f"building static {g.role} graph, width {shape.verify_width}")
                w = draft_weights if g.model == "draft" else weights
                static_graphs.append(
                    write_static_graph(
                        w, g.role, g.model, out, store, np.dtype(DTYPES[c.dtype]), shape
                    )
                )
    finally:
        store.close()

    steps("saving tokenizer")
    tokenizer_files = save_tokenizer(tokenizer, out)
    bos, eos = special_ids(target, tokenizer)
    manifest = Manifest(
        source={"model": str(model), "revision": c.revision},
        target=info,
        dtype=c.dtype,
        quantization=c.quantize,
        tokenizer_files=tokenizer_files,
        bos_token_id=bos,
        eos_token_ids=eos,
        weights_file=WEIGHTS_FILE,
        graphs=graphs,
        backbone_fingerprint=backbone_fingerprint(tokenizer, weights),
        draft=draft_info,
        draft_source={"model": str(c.draft)} if c.draft is not None else None,
        created_by=f"edgespec {__version__}",
        static=StaticVariants(c.max_context, widths, static_graphs) if c.static else None,
        coreml=CoreMLVariants(c.max_context, widths[-1], packages) if c.coreml else None,
        variant=c.variant,
        backbone_layers=c.backbone_layers,
        backbone=backbone_record(tokenizer, weights),
        chat=save_chat_format(tokenizer, target, out),
        step_width=c.step_width(),
        tree_graphs=tree_graphs,
        feature_layers=list(c.feature_layers),
    )
    if c.quant is not None:
        manifest.extra["quantization"] = c.quant.describe()
    if draft_info is not None and c.draft_quant != c.quant:  # absent: the draft's are the target's
        q = c.draft_quant
        manifest.extra["draft_quantization"] = q.describe() if q else {"method": "none"}
    if imported is not None:
        steps("building eagle graph")
        imported.write(out, manifest, weights, c)
    if adapters:
        manifest.extra["exit_adapters"] = {str(k): r for k, r in adapters.items()}
    if c.verify and c.variant == "shared-backbone":
        steps("checking the exported head against transformers")
        k = int(c.backbone_layers or 0)
        diff = verify_head(target, out / graphs[0].file, k)
        manifest.extra["export_check"] = {"max_abs_hidden_diff": diff}
    elif c.verify:
        steps("checking the exported graph against transformers")
        manifest.extra["export_check"] = verify_export(
            target, out / "full.onnx", info, c.dtype, c.quantize
        )
        if c.static:
            steps("checking the static graph against transformers")
            manifest.extra["static_check"] = verify_static(target, out, manifest)
    save_manifest(manifest, out)
    steps("done")
    return manifest


def _quiet(what: str) -> None:
    """No progress callback given: the steps go unreported."""
