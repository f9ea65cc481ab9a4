"""Hugging Face checkpoint -> edgespec bundle (build time: needs torch and transformers).

`export_bundle(model, out, ...)` takes a local checkpoint folder or a hub id (plus an
optional separate draft model and early-exit layers), writes the ONNX graphs of each role,
the tokenizer files, one shared weights file and `manifest.json`, and checks the exported
`full` graph against the transformers model before it returns. Every user mistake is an
`ExportError` saying what is wrong and what to do.

`variant="shared-backbone", backbone_layers=k` writes an edge bundle instead: only head@k
(the target's embeddings and lower k layers, final norm and LM head, plus an exit adapter
with `fit_exit_adapter`), a frozen draft for split decoding against any target that keeps
those layers and the tokenizer (see `edgespec.backbone`). `fit_exit_adapter=CALIB.txt`
fits an adapter into every head@k (`exit_adapter.py`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx

from edgespec import __version__
from edgespec.bundle import (
    CoreMLVariants,
    GraphInfo,
    Manifest,
    ModelInfo,
    StaticVariants,
    save_manifest,
)
from edgespec.export import gpt2, llama
from edgespec.export.builder import GraphBuilder, WeightStore
from edgespec.export.chat_format import save_chat_format
from edgespec.export.decoder import DecoderWeights, build_graph, graph_info
from edgespec.export.quantize import QdqCalibration, QuantConfig, externalize
from edgespec.export.shared_backbone import backbone_record, verify_head
from edgespec.export.static import static_shapes, verify_static, write_static_graph

# model_type (transformers config) -> the family module that extracts its weights.
FAMILIES: dict[str, ModuleType] = {"llama": llama, "qwen2": llama, "gpt2": gpt2}
DTYPES = {"fp32": np.float32, "fp16": np.float16}
VARIANTS = ("standard", "shared-backbone")
WEIGHTS_FILE = "weights.bin"


class ExportError(ValueError):
    """The checkpoint or the options cannot be exported; the message says why and what to do."""


def export_bundle(
    model: str | Path,
    out: str | Path,
    *,
    draft: str | Path | None = None,
    exit_layers: Sequence[int] = (),
    dtype: str = "fp32",
    quantize: str | None = None,
    block_size: int = 32,
    accuracy_level: int = 4,
    calibration_prompts: Sequence[str] | None = None,
    revision: str | None = None,
    verify: bool = True,
    overwrite: bool = False,
    progress: bool = True,
    static: bool = False,
    max_context: int = 512,
    verify_width: int | Sequence[int] = 8,
    coreml: bool = False,
    variant: str = "standard",
    backbone_layers: int | None = None,
    fit_exit_adapter: str | Path | None = None,
    adapter_steps: int = 300,
) -> Manifest:
    """Export `model` (and `draft`) to an edgespec bundle in `out`; return its manifest.

    static: also write fixed-shape copies of every graph (`max_context` cache positions,
    `verify_width` positions per call — one set per width when several are given, e.g.
    (1, 8) — standard ONNX ops only) for NPUs; the dynamic graphs stay, so the bundle still
    runs anywhere (`edgespec.load(..., static=True)` picks these).
    coreml: also convert every role to a Core ML ML program (.mlpackage: iOS 18 / macOS 15,
    fp16, KV cache in Core ML states) with the same max context and the largest verify
    width; needs the [coreml] extra (coremltools).
    quantize: None | "int8" | "int4" (`block_size`, `accuracy_level`) | "qdq-int8"
    (calibrated on `calibration_prompts`, default a few built-in ones); see export/quantize.py.
    variant: "shared-backbone" writes an edge bundle holding only head@`backbone_layers` (a
    frozen draft for split decoding, see edgespec.backbone); `fit_exit_adapter`: a calibration
    text file on which an adapter is fitted into every head@k (export/exit_adapter.py).
    """
    exit_layers = _check_variant(variant, backbone_layers, exit_layers, draft, fit_exit_adapter)
    if dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype!r} is not supported; choose one of {', '.join(DTYPES)}")
    quant = None
    if quantize is not None:
        try:
            quant = QuantConfig(
                quantize,
                block_size,
                accuracy_level,
                *([tuple(calibration_prompts)] if calibration_prompts is not None else []),
            )
        except ValueError as e:
            raise ExportError(str(e)) from None
        if quantize == "qdq-int8" and dtype != "fp32":
            raise ExportError("--quantize qdq-int8 starts from fp32 graphs: use --dtype fp32")
    out = _prepare_out(Path(out), overwrite)
    steps = _Progress(progress)
    steps("loading " + str(model))
    target, tokenizer = load_checkpoint(model, revision)
    info = model_info(target)
    for k in exit_layers:
        if not 0 < k < info.num_layers:
            option = "--backbone-layers" if variant == "shared-backbone" else "--exit-layers"
            raise ExportError(
                f"{option} {k} is out of range: the model has {info.num_layers} layers, "
                f"so an exit layer must be between 1 and {info.num_layers - 1}"
            )
    draft_model = draft_info = None
    if draft is not None:
        steps("loading draft " + str(draft))
        draft_model, draft_tok = load_checkpoint(draft, None)
        check_same_tokenizer(tokenizer, draft_tok, model, draft)
        draft_info = model_info(draft_model)
    if coreml:
        try:
            import coremltools  # noqa: F401
        except ImportError as e:
            raise ExportError(
                f"--coreml needs coremltools ({e}): pip install 'edgespec[coreml]'"
            ) from None
    widths = sorted({verify_width} if isinstance(verify_width, int) else set(verify_width))
    shapes = []
    if static or coreml:
        try:
            shapes = static_shapes(max_context, widths, quantize, [info, draft_info])
        except ValueError as e:
            raise ExportError(str(e)) from None

    steps("extracting weights")
    weights = extract(target)
    adapters = {}
    if fit_exit_adapter is not None:  # before any file is written: bad text fails cleanly
        from edgespec.export.exit_adapter import fit_exit_adapters

        steps("fitting exit adapters")
        adapters = fit_exit_adapters(
            target, tokenizer, weights, sorted(set(exit_layers)), fit_exit_adapter,
            steps=adapter_steps, progress=progress,
        )  # fmt: skip
    store = WeightStore(out / WEIGHTS_FILE)
    graphs: list[GraphInfo] = []
    static_graphs: list[GraphInfo] = []
    packages = []
    qdq = None
    if quant is not None and quant.method == "qdq-int8":
        qdq = QdqCalibration(calibration_ids(tokenizer, quant.calibration_prompts, info))
    try:
        roles = ["full"] + [
            f"{kind}@{k}" for k in sorted(set(exit_layers)) for kind in ("head", "tail")
        ]
        if variant == "shared-backbone":
            roles = [f"head@{backbone_layers}"]
        for role in roles:
            steps(f"building {role} graph")
            graphs.append(_write_graph(weights, role, "target", out, store, dtype, quant, qdq))
        if draft_model is not None:
            steps("building draft graph")
            draft_weights = extract(draft_model, prefix="draft.")
            if qdq is not None:  # the draft's own hidden states
                qdq = QdqCalibration(qdq.prompt_ids)
            graphs.append(
                _write_graph(draft_weights, "draft", "draft", out, store, dtype, quant, qdq)
            )
        if coreml:
            from edgespec.export.coreml import write_coreml_package

            for g in graphs:
                steps(f"converting {g.role} to Core ML")
                w = draft_weights if g.model == "draft" else weights
                packages.append(write_coreml_package(w, g.role, g.model, out, shapes[-1]))
        for shape in shapes if static else []:
            for g in graphs:
                steps(f"building static {g.role} graph, width {shape.verify_width}")
                w = draft_weights if g.model == "draft" else weights
                static_graphs.append(
                    write_static_graph(
                        w, g.role, g.model, out, store, np.dtype(DTYPES[dtype]), shape
                    )
                )
    finally:
        store.close()

    steps("saving tokenizer")
    tokenizer_files = save_tokenizer(tokenizer, out)
    bos, eos = special_ids(target, tokenizer)
    manifest = Manifest(
        source={"model": str(model), "revision": revision},
        target=info,
        dtype=dtype,
        quantization=quantize,
        tokenizer_files=tokenizer_files,
        bos_token_id=bos,
        eos_token_ids=eos,
        weights_file=WEIGHTS_FILE,
        graphs=graphs,
        backbone_fingerprint=backbone_fingerprint(tokenizer, weights),
        draft=draft_info,
        draft_source={"model": str(draft)} if draft is not None else None,
        created_by=f"edgespec {__version__}",
        static=StaticVariants(max_context, widths, static_graphs) if static else None,
        coreml=CoreMLVariants(max_context, widths[-1], packages) if coreml else None,
        variant=variant,
        backbone_layers=backbone_layers,
        backbone=backbone_record(tokenizer, weights),
        chat=save_chat_format(tokenizer, target, out),
    )
    if quant is not None:
        manifest.extra["quantization"] = quant.describe()
    if adapters:
        manifest.extra["exit_adapters"] = {str(k): r for k, r in adapters.items()}
    if verify and variant == "shared-backbone":
        steps("checking the exported head against transformers")
        k = int(backbone_layers or 0)
        diff = verify_head(target, out / graphs[0].file, k, info.num_kv_heads, info.head_dim)
        manifest.extra["export_check"] = {"max_abs_hidden_diff": diff}
    elif verify:
        steps("checking the exported graph against transformers")
        manifest.extra["export_check"] = verify_export(
            target, out / "full.onnx", info, dtype, quantize
        )
        if static:
            steps("checking the static graph against transformers")
            manifest.extra["static_check"] = verify_static(target, out, manifest)
    save_manifest(manifest, out)
    steps.close()
    return manifest


def _check_variant(
    variant: str,
    backbone_layers: int | None,
    exit_layers: Sequence[int],
    draft: object,
    fit_exit_adapter: object,
) -> Sequence[int]:
    """The exit layers to build (a shared-backbone bundle: exactly its backbone depth)."""
    if variant not in VARIANTS:
        raise ExportError(f"--variant {variant!r} is not one of: {', '.join(VARIANTS)}")
    if variant == "standard":
        if backbone_layers is not None:
            raise ExportError("--backbone-layers needs --variant shared-backbone")
        if fit_exit_adapter is not None and not exit_layers:
            raise ExportError("--fit-exit-adapter fits head@k adapters: also pass --exit-layers K")
        return exit_layers
    if backbone_layers is None:
        raise ExportError(
            "--variant shared-backbone needs --backbone-layers K: how many lower layers the "
            "edge draft shares with the target"
        )
    if draft is not None:
        raise ExportError(
            "--variant shared-backbone drafts with the target's own lower layers: drop --draft"
        )
    if any(k != backbone_layers for k in exit_layers):
        raise ExportError(
            f"a shared-backbone bundle holds only head@{backbone_layers}: drop --exit-layers"
        )
    return [backbone_layers]


def _prepare_out(out: Path, overwrite: bool) -> Path:
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file; give a folder path")
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise ExportError(f"--out {out} is not empty; choose a new folder or pass --overwrite")
        if not (out / "manifest.json").exists():
            raise ExportError(
                f"--out {out} is not empty and is not a bundle; refusing to overwrite it"
            )
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


class _Progress:
    """The export step being worked on: one live line with the elapsed time on a terminal
    (tqdm), one plain line per step in a log (a redrawn line there is an unreadable run-on)."""

    def __init__(self, enabled: bool) -> None:
        self.bar: Any = None
        self.lines = enabled and not sys.stderr.isatty()
        self.start = time.perf_counter()
        if enabled and not self.lines:
            from tqdm import tqdm

            self.bar = tqdm(total=0, bar_format="{desc} [{elapsed}]", leave=True)

    def __call__(self, what: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(f"export: {what}")
            self.bar.refresh()
        elif self.lines:
            print(f"export: {what} [{time.perf_counter() - self.start:.1f} s]", file=sys.stderr)

    def close(self) -> None:
        self("done")
        if self.bar is not None:
            self.bar.close()


def load_checkpoint(model: str | Path, revision: str | None) -> tuple[Any, Any]:
    """A transformers causal LM and its fast tokenizer, from a local folder or a hub id."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from edgespec.export.builtin import BUILTIN_PREFIX, builtin_checkpoint

    source = str(model)
    if source.startswith(BUILTIN_PREFIX):
        source = str(builtin_checkpoint(source))
    local = Path(source).expanduser()
    if local.exists():
        if not (local / "config.json").exists():
            raise ExportError(f"{local} has no config.json: not a Hugging Face checkpoint folder")
        source = str(local)
    elif source.startswith((".", "/", "~")) or source.count("/") > 1:
        raise ExportError(f"model folder {source} does not exist")
    try:
        config = AutoConfig.from_pretrained(source, revision=revision)
    except (OSError, ValueError) as e:
        raise ExportError(
            f"cannot load a config for {source!r}: {e}\n"
            "Pass a local checkpoint folder, or a hub id with network access (or a warm HF cache)."
        ) from None
    family_of(config)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, revision=revision)
    except (OSError, ValueError) as e:
        raise ExportError(f"cannot load the tokenizer of {source!r}: {e}") from None
    if not getattr(tokenizer, "is_fast", False):
        raise ExportError(
            f"{source!r} has no fast tokenizer (tokenizer.json), which edgespec needs"
        )
    hf = AutoModelForCausalLM.from_pretrained(source, revision=revision, dtype=torch.float32)
    return hf.eval(), tokenizer


def family_of(config: Any) -> ModuleType:
    family = FAMILIES.get(config.model_type)
    if family is None:
        raise ExportError(
            f"architecture {config.model_type!r} is not supported; supported: "
            + ", ".join(sorted(FAMILIES))
        )
    try:
        family.check(config)
    except ValueError as e:
        raise ExportError(str(e)) from None
    return family


def extract(hf_model: Any, prefix: str = "") -> DecoderWeights:
    weights = family_of(hf_model.config).extract(hf_model, prefix=prefix)
    if weights.attn.head_dim % 16:
        raise ExportError(
            f"head_dim {weights.attn.head_dim} is not a multiple of 16, which onnxruntime's "
            "GroupQueryAttention kernel requires"
        )
    return weights


def model_info(hf_model: Any) -> ModelInfo:
    cfg = hf_model.config
    family = family_of(cfg)
    heads = cfg.num_attention_heads
    return ModelInfo(
        architecture=family.__name__.rsplit(".", 1)[-1],
        model_type=cfg.model_type,
        num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        num_heads=heads,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        vocab_size=cfg.vocab_size,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
    )


def check_same_tokenizer(target_tok: Any, draft_tok: Any, target: Any, draft: Any) -> None:
    t, d = target_tok.get_vocab(), draft_tok.get_vocab()
    if t != d:
        only_t = len(set(t.items()) - set(d.items()))
        raise ExportError(
            f"draft {draft} does not share the tokenizer of {target} ({len(t)} vs {len(d)} "
            f"tokens, {only_t} differ): speculative decoding needs the same token ids. Pick a "
            "draft from the same model family (same tokenizer)."
        )


def _write_graph(
    weights: DecoderWeights,
    role: str,
    model: str,
    out: Path,
    store: WeightStore,
    dtype: str,
    quant: QuantConfig | None,
    qdq: QdqCalibration | None = None,
) -> GraphInfo:
    weight_only = quant.method if quant is not None and qdq is None else None
    kw = {"block_size": quant.block_size, "accuracy_level": quant.accuracy_level} if quant else {}
    if qdq is None:
        gb = GraphBuilder(store=store, dtype=np.dtype(DTYPES[dtype]), quantize=weight_only, **kw)
        build_graph(weights, role, gb)
        proto = gb.model(f"edgespec_{role}")
    else:  # float graph in a scratch file, quantized, then its tensors into the bundle's file
        with tempfile.TemporaryDirectory() as tmp:
            scratch = WeightStore(Path(tmp) / "float.bin")
            gb = GraphBuilder(store=scratch, dtype=np.dtype(np.float32), matmul_head=True)
            build_graph(weights, role, gb)
            scratch.close()
            proto = gb.model(f"edgespec_{role}")
            onnx.load_external_data_for_model(proto, tmp)
        proto = externalize(qdq.quantize(proto, role), store)
    file = role.replace("@", "_at_") + ".onnx"
    onnx.save(proto, str(out / file))
    return graph_info(role, file, model, len(weights.layers), gb)


def calibration_ids(tokenizer: Any, prompts: Sequence[str], info: ModelInfo) -> list[list[int]]:
    """Token ids of the calibration prompts, clipped to the vocabulary and the context."""
    out = []
    for text in prompts:
        ids = [i for i in tokenizer(text)["input_ids"] if 0 <= i < info.vocab_size]
        if ids:
            out.append(ids[: min(128, info.max_position_embeddings - 1)])
    if not out:
        raise ExportError("the calibration prompts tokenize to nothing: give some text")
    return out


def save_tokenizer(tokenizer: Any, out: Path) -> list[str]:
    tokenizer.save_pretrained(str(out))
    files = [
        f
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
        if (out / f).exists()
    ]
    if "tokenizer.json" not in files:
        raise ExportError(
            "the tokenizer did not save a tokenizer.json; edgespec needs a fast tokenizer"
        )
    return files


def special_ids(hf_model: Any, tokenizer: Any) -> tuple[int | None, list[int]]:
    gen = getattr(hf_model, "generation_config", None)
    eos: Any = getattr(gen, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    eos_ids = [] if eos is None else [int(e) for e in (eos if isinstance(eos, list) else [eos])]
    bos = tokenizer.bos_token_id
    return (None if bos is None else int(bos)), eos_ids


def backbone_fingerprint(tokenizer: Any, weights: DecoderWeights) -> str:
    """sha256 of the tokenizer vocabulary and the embedding table: what a draft must share."""
    h = hashlib.sha256()
    h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(np.ascontiguousarray(weights.embed, dtype=np.float32).tobytes())
    return "sha256:" + h.hexdigest()


def verify_export(
    hf_model: Any, path: Path, info: ModelInfo, dtype: str, quantize: str | None
) -> dict[str, float]:
    """Run the exported full graph and transformers on one short random prompt; compare logits."""
    import onnxruntime as ort
    import torch

    from edgespec.runtime.graph import session_options

    rng = np.random.default_rng(0)
    ids = rng.integers(0, info.vocab_size, size=(1, 8), dtype=np.int64)
    with torch.no_grad():
        ref = hf_model(torch.from_numpy(ids)).logits.float().numpy()
    sess = ort.InferenceSession(str(path), session_options(None), ["CPUExecutionProvider"])
    kv_dtype = np.float16 if dtype == "fp16" else np.float32
    feeds: dict[str, np.ndarray] = {
        "input_ids": ids,
        "seqlens_k": np.array([ids.shape[1] - 1], np.int32),
        "total_seq_len": np.array(ids.shape[1], np.int32),
        "num_logits_to_keep": np.array(ids.shape[1], np.int64),
    }
    for i in range(info.num_layers):
        for kind in ("key", "value"):
            feeds[f"past_{kind}.{i}"] = np.zeros((1, info.num_kv_heads, 0, info.head_dim), kv_dtype)
    got = sess.run(["logits"], feeds)[0]
    diff = float(np.abs(got - ref).max())
    scale = float(np.abs(ref).max()) or 1.0
    same_argmax = float((got.argmax(-1) == ref.argmax(-1)).mean())
    if dtype == "fp32" and quantize is None and diff > 1e-3 * max(scale, 1.0):
        raise ExportError(
            f"the exported graph disagrees with transformers (max logit difference {diff:.3g}); "
            "this is a bug in edgespec's export of this architecture, please report it"
        )
    return {"max_abs_logit_diff": diff, "argmax_agreement": same_argmax}
