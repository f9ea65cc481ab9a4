"""A GGUF file -> an edgespec bundle, without torch (numpy, onnx and the `gguf` package).

`export_gguf(path, out, config)` reads the file (gguf_model.py: weights, with quantized blocks
kept as they are; gguf_vocab.py: tokenizer and chat template), refuses what it cannot take
before any file is written (an `ExportError` naming the metadata field, tensor or option),
builds the graphs the Hugging Face path builds (`GraphSink`, the same builders), writes the
tokenizer files and the manifest, and checks the exported `full` graph against a numpy
reference forward of the same weights (export/reference.py) at their exact dequantized
values. The manifest's `extra["gguf"]` says where each part came from: the file, its
architecture and tensor types, how each kind of tensor was held (kept blocks, float,
or re-quantized with the error measured), the tokenizer's and the chat template's metadata.

`config.quantize` ("int8" / "int4") re-quantizes every weight from its dequantized values,
on request. `config.draft` adds a separate draft model from a Hugging Face folder (loaded
through transformers: torch, the [export] extra; its vocabulary must be the file's token for
token), written as `--draft-quantize` says (default: float). Options that need a Hugging Face
target (exit adapters fitted through torch, static / Core ML graphs, a shared-backbone edge
bundle) are refused.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from edgespec import __version__
from edgespec.bundle import GraphInfo, Manifest, save_manifest
from edgespec.export.builder import WeightStore
from edgespec.export.config import ExportConfig
from edgespec.export.decoder import DecoderWeights
from edgespec.export.eagle_gguf import ImportedHead
from edgespec.export.errors import ExportError
from edgespec.export.feeds import prefill_feed, session_inputs
from edgespec.export.gguf_blocks import PackedMatrix
from edgespec.export.gguf_model import GGUFModel, read_gguf
from edgespec.export.gguf_vocab import chat_format, tokenizer_files, write_tokenizer
from edgespec.export.reference import reference_logits
from edgespec.export.sink import WEIGHTS_FILE, GraphSink, _check_out, _prepare_out

# options an export from a GGUF file refuses: (field, its default, why)
REFUSED = (
    ("static", False, "--static is not available for GGUF imports yet"),
    ("coreml", False, "--coreml is not available for GGUF imports yet"),
    ("tree_verify", False, "--tree-verify is not available for GGUF imports yet"),
    ("variant", "standard", "--variant shared-backbone is not available for GGUF imports"),
    ("fit_exit_adapter", None, "--fit-exit-adapter trains through torch on a Hugging Face model"),
    ("revision", None, "--revision names a hub revision; a GGUF file is local"),
)


def is_gguf(model: str | Path) -> bool:
    """A path ending in .gguf, or a file that starts with GGUF's magic."""
    p = Path(str(model)).expanduser()
    if p.suffix.lower() == ".gguf":
        return True
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        return f.read(4) == b"GGUF"


def export_gguf(path: str | Path, out: str | Path, config: ExportConfig | None = None) -> Manifest:
    """Export the GGUF file `path` to a bundle in `out`; return its manifest."""
    c = config or ExportConfig()
    for name, default, why in REFUSED:
        if getattr(c, name) != default:
            raise ExportError(f"{why}; drop it to import {path}")
    if c.quant is not None and c.quant.method == "qdq-int8":
        raise ExportError("--quantize qdq-int8 is not available for GGUF imports; use int8/int4")
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ExportError(
            "importing a GGUF file needs the gguf package: pip install 'edgespec[gguf]'"
        ) from None
    path, out = Path(path).expanduser(), Path(out)
    if not path.is_file():
        raise ExportError(f"GGUF file {path} does not exist")
    _check_out(out, c.overwrite)
    steps = c.on_progress or (lambda _: None)
    steps(f"reading {path}")
    try:
        model = read_gguf(path)
        files = tokenizer_files(model.metadata, model.metadata["general.architecture"])
    except ValueError as e:
        raise ExportError(f"{path.name}: {e}") from None
    info = model.info
    for k in c.exit_layers:
        if not 0 < k < info.num_layers:
            raise ExportError(
                f"--exit-layers {k} is out of range: the model has {info.num_layers} layers"
            )
    imported = None
    if c.eagle_gguf is not None:
        steps(f"reading the EAGLE-3 head {c.eagle_gguf}")
        imported = ImportedHead(c, model.weights, info.num_layers)
        c = dataclasses.replace(c, feature_layers=imported.layers)
    c.check_feature_layers(info.num_layers)
    for name, err in sorted(model.requantized.items()):
        steps(
            f"re-quantized {name} to int8 blocks of 32 (its type has no exact MatMulNBits "
            f"form): max abs error {err['max_abs_error']:.3g}, relative RMS "
            f"{err['relative_rms_error']:.3g}"
        )
    draft = _draft(c, files, path, steps) if c.draft is not None else None
    weights = model.weights
    if c.quant is not None:
        steps(f"dequantizing every weight to re-quantize it as {c.quant.method}")
        weights = _dequantized(weights)
    elif c.gguf_weights == "float":
        steps("dequantizing every weight to float32 (--gguf-weights float)")
        weights = _dequantized(weights)
    if c.feature_layers:
        weights = dataclasses.replace(weights, feature_layers=tuple(c.feature_layers))
    _prepare_out(out, c.overwrite)

    store = WeightStore(out / WEIGHTS_FILE)
    sink = GraphSink(out, store, c.dtype, bool(c.batched_verify), c.accuracy_level)
    exits = sorted(set(c.exit_layers))
    roles = ["full"] + [f"{kind}@{k}" for k in exits for kind in ("head", "tail")]
    graphs: list[GraphInfo] = []
    try:
        for role in roles:
            steps(f"building {role} graph")
            graphs.append(sink.write(weights, role, "target", c.quant))
        if draft is not None:
            steps("building draft graph")
            graphs.append(sink.write(draft[0], "draft", "draft", c.draft_quant))
    finally:
        store.close()
    steps("saving tokenizer")
    tok_files = write_tokenizer(files, out)
    config_json = files["tokenizer_config.json"]
    meta = model.metadata
    eos = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    manifest = Manifest(
        source={"model": str(path), "revision": None, "format": "gguf"},
        target=info,
        dtype=c.dtype,
        quantization=c.quantize,
        tokenizer_files=tok_files,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=list(dict.fromkeys(int(i) for i in eos if i is not None)),
        weights_file=WEIGHTS_FILE,
        graphs=graphs,
        backbone_fingerprint=_fingerprint(files, weights),
        created_by=f"edgespec {__version__}",
        chat=chat_format(meta, config_json, out),
        step_width=c.step_width(),
        draft=draft[1] if draft is not None else None,
        draft_source={"model": str(c.draft)} if draft is not None else None,
        feature_layers=list(c.feature_layers),
    )
    manifest.extra["gguf"] = provenance(path, model, c)
    if imported is not None:
        steps("building eagle graph")
        imported.write(out, manifest, weights, c)
    if draft is not None:
        q = c.draft_quant if c.draft_quantize is not None else None
        manifest.extra["draft_quantization"] = q.describe() if q else {"method": "none"}
    if c.quant is not None:
        manifest.extra["quantization"] = c.quant.describe()
    if c.verify:
        steps("checking the exported graph against a numpy reference of the same weights")
        manifest.extra["export_check"] = verify_gguf(weights, out / "full.onnx", c)
    save_manifest(manifest, out)
    steps("done")
    return manifest


def _draft(c: ExportConfig, files: dict[str, Any], path: Path, steps: Any) -> tuple[Any, Any]:
    """The `--draft` Hugging Face model's weights and its manifest record, or an ExportError
    (before anything is written) naming what is wrong with it."""
    try:
        from edgespec.export.hf import check_same_vocab, extract, load_checkpoint, model_info
    except ImportError:  # pragma: no cover - the [export] extra is missing
        raise ExportError(
            "--draft loads the draft model through transformers: pip install 'edgespec[export]'"
        ) from None
    steps(f"loading draft {c.draft}")
    hf_model, tok = load_checkpoint(c.draft, None)
    ours = {**files["tokenizer.json"]["model"]["vocab"]}
    ours.update({t["content"]: t["id"] for t in files["tokenizer.json"].get("added_tokens", [])})
    check_same_vocab(ours, tok.get_vocab(), path.name, c.draft)
    return extract(hf_model, prefix="draft."), model_info(hf_model)


def _dequantized(w: DecoderWeights) -> DecoderWeights:
    """Every packed matrix as its exact float32 values (for `--quantize`)."""

    def f(a: Any) -> Any:
        return np.asarray(a, np.float32) if isinstance(a, PackedMatrix) else a

    embed = f(w.embed)
    layers = [
        dataclasses.replace(
            lw, qkv_w=f(lw.qkv_w), o_w=f(lw.o_w), up_w=f(lw.up_w), down_w=f(lw.down_w)
        )
        for lw in w.layers
    ]
    head = embed if w.tied else f(w.lm_head)
    return dataclasses.replace(w, embed=embed, lm_head=head, layers=layers)


def provenance(path: Path, model: GGUFModel, c: ExportConfig) -> dict[str, Any]:
    """Where each part of the bundle came from (shown by `edgespec inspect`)."""
    meta = model.metadata
    held = Counter(
        v.split("->", 1)[1].strip() + f" (from {v.split('->', 1)[0].strip()})"
        for v in model.provenance.values()
    )
    weights = dict(sorted(held.items()))
    if c.quant is not None:
        weights = {f"re-quantized {c.quant.method} from the dequantized file (--quantize)": 1}
    elif c.gguf_weights == "float":
        weights = {"float32: the file's exact dequantized values (--gguf-weights float)": 1}
    return {
        "file": path.name,
        "architecture": meta.get("general.architecture"),
        "name": meta.get("general.name"),
        "file_type": meta.get("general.file_type"),
        "weights": weights,
        "requantized": model.requantized,
        "tokenizer": f"tokenizer.ggml.model={meta.get('tokenizer.ggml.model')!r}, "
        f"pre={meta.get('tokenizer.ggml.pre')!r}: tokenizer.json built from its vocabulary",
        "chat_template": "tokenizer.chat_template" if meta.get("tokenizer.chat_template") else None,
        "config": f"{meta.get('general.architecture')}.* metadata",
    }


def _fingerprint(files: dict[str, Any], w: DecoderWeights) -> str:
    import hashlib
    import json

    h = hashlib.sha256()
    vocab = files["tokenizer.json"]["model"]["vocab"]
    h.update(json.dumps(sorted(vocab.items())).encode())
    h.update(np.ascontiguousarray(np.asarray(w.embed, np.float32)).tobytes())
    return "sha256:" + h.hexdigest()


def verify_gguf(w: DecoderWeights, full: Path, c: ExportConfig) -> dict[str, float]:
    """The full graph against the numpy reference on 8 random tokens. Float weights with
    float compute (fp32, accuracy level 0 or no packed blocks) must agree to 1e-3 of the
    logit scale; otherwise the difference and argmax agreement are recorded."""
    import onnxruntime as ort

    from edgespec.runtime.graphs.session import session_options

    ids = np.random.default_rng(0).integers(0, w.embed.shape[0], size=(1, 8), dtype=np.int64)
    ref = reference_logits(w, ids[0])
    sess = ort.InferenceSession(str(full), session_options(None), ["CPUExecutionProvider"])
    got = sess.run(["logits"], prefill_feed(session_inputs(sess), ids))[0][0]
    diff = float(np.abs(got - ref).max())
    scale = max(float(np.abs(ref).max()), 1.0)
    packed = _has_packed(w)
    exact = c.dtype == "fp32" and (not packed or c.accuracy_level in (0, 1))
    if exact and c.quant is None and diff > 1e-3 * scale:
        raise ExportError(
            f"the exported graph disagrees with the numpy reference (max logit difference "
            f"{diff:.3g}); this is a bug in edgespec's GGUF import, please report it"
        )
    return {
        "reference": "numpy forward of the GGUF's dequantized weights",
        "max_abs_logit_diff": diff,
        "argmax_agreement": float((got.argmax(-1) == ref.argmax(-1)).mean()),
    }


def _has_packed(w: DecoderWeights) -> bool:
    mats = [w.embed, w.lm_head] + [m for lw in w.layers for m in (lw.qkv_w, lw.o_w, lw.up_w,
                                                                    lw.down_w)]  # fmt: skip
    return any(isinstance(m, PackedMatrix) for m in mats)
