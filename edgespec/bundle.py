"""The edgespec bundle: a folder whose `manifest.json` says what is inside.

Takes a bundle folder; guarantees that what `load_manifest` returns was checked against the
schema (version, required keys, files present, graph roles well formed), so the runtime can
trust it. Every problem is a `BundleError` naming the file, what is wrong and what to do.
Imports only the standard library: apps embed this.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgespec.errors import EdgespecError

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
FORMAT = "edgespec-bundle"
ROLE_PATTERN = re.compile(r"^(full|draft|eagle|head@(\d+)|tail@(\d+))$")
FEATURES = "features"  # the output a target graph declares its feature layers' states in


class BundleError(EdgespecError, ValueError):
    """A bundle is missing, malformed or incompatible; the message says what to do."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # "float32" | "float16" | "int64" | "int32" | "bool"
    shape: list[int | str]  # ints are fixed, strings are named dynamic axes


@dataclass(frozen=True)
class ModelInfo:
    """The dimensions of one transformer (the target, or a separate draft)."""

    architecture: str  # family in edgespec.export: "llama" | "gpt2"
    model_type: str  # transformers' config.model_type
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool


@dataclass(frozen=True)
class GraphInfo:
    """One ONNX graph of the bundle and its I/O contract.

    `kv_layers` are the global indices of the layers whose KV cache the graph reads and
    writes: inputs `past_key.{i}` / `past_value.{i}` and outputs `present_key.{i}` /
    `present_value.{i}`, shape [batch, kv_heads, capacity, head_dim], meant to be bound to
    the same preallocated buffer (the graph writes the new positions in place).
    """

    role: str  # full | draft | eagle | head@k | tail@k
    file: str
    model: str  # "target" or "draft": whose dimensions apply (eagle: the target's)
    kv_layers: list[int]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]

    @property
    def exit_layer(self) -> int | None:
        m = ROLE_PATTERN.match(self.role)
        if m and (m.group(2) or m.group(3)):
            return int(m.group(2) or m.group(3))
        return None


@dataclass(frozen=True)
class StaticVariants:
    """Fixed-shape copies of the graphs, for NPUs that reject dynamic shapes.

    Each graph takes exactly W new positions (one set of graphs per width in
    `verify_widths`, e.g. 1 for decoding and 8 for verification and prefill) and a cache of exactly
    `max_context` (C) positions: inputs `input_ids` [1, W] int32 (tail@k: `hidden`
    [1, W, H]), `position_ids` [1, W] int32, `attention_mask` [1, 1, W, C + W] (additive,
    float32; columns 0..C-1 the cache, then the new tokens), `past_key.{i}` /
    `past_value.{i}` [1, kv_heads, C, head_dim]; outputs the logits of all W positions and
    only the W new positions `new_key.{i}` / `new_value.{i}` [1, kv_heads, W, head_dim],
    which the runtime copies into its cache. Standard ONNX ops only (no com.microsoft contrib ops).
    """

    max_context: int
    verify_widths: list[int]  # ascending
    graphs: list[GraphInfo]  # one per role and width

    def graphs_for(self, role: str) -> dict[int, GraphInfo]:
        """width -> the static graph of `role` with that width."""
        found = {static_width(g): g for g in self.graphs if g.role == role}
        if not found:
            raise BundleError(
                f"this bundle's static variants have no '{role}' graph (they have: "
                f"{', '.join(sorted({g.role for g in self.graphs}))}); " + _how_to_add(role)
            )
        return found


def static_width(graph: GraphInfo) -> int:
    """W of a static graph: the length of its `position_ids` input [1, W]."""
    return int(next(t.shape[1] for t in graph.inputs if t.name == "position_ids"))


@dataclass(frozen=True)
class CoreMLPackage:
    """One Core ML ML program (.mlpackage folder) of a role, for Apple devices.

    Fixed shapes like the static graphs (W positions per call), but the KV cache lives in
    the model as Core ML states (`key_cache_{i}` / `value_cache_{i}`, [1, kv_heads, C + W,
    head_dim], iOS 18 / macOS 15) written at `write_offset`; see edgespec/export/coreml.py.
    """

    role: str  # full | draft | head@k | tail@k
    path: str  # the .mlpackage folder, relative to the bundle
    model: str  # "target" or "draft"
    kv_layers: list[int]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    states: list[TensorSpec]


@dataclass(frozen=True)
class CoreMLVariants:
    max_context: int
    verify_width: int
    packages: list[CoreMLPackage]

    def package(self, role: str) -> CoreMLPackage:
        for p in self.packages:
            if p.role == role:
                return p
        raise BundleError(
            f"this bundle's Core ML packages have no '{role}' role (they have: "
            f"{', '.join(p.role for p in self.packages)}); " + _how_to_add(role)
        )


@dataclass(frozen=True)
class ChatFormat:
    """How the model expects a conversation, copied from its tokenizer and generation config.

    `templates`: template name -> a jinja file in the bundle (Hugging Face chat templates;
    "default" is used unless a name is asked for, "tool_use" when tools are given and it
    exists). `special_tokens`: the named special tokens the template sees (bos_token,
    eos_token, ...). `generation`: the model's default sampling (do_sample, temperature,
    top_p, top_k, max_new_tokens, ...: only the keys its generation config sets).
    """

    templates: dict[str, str]
    special_tokens: dict[str, str] = field(default_factory=dict)
    generation: dict[str, Any] = field(default_factory=dict)


@dataclass
class Manifest:
    source: dict[str, Any]  # {"model": id or path, "revision": str | None}
    target: ModelInfo
    dtype: str  # fp32 | fp16
    quantization: str | None  # None | "int8"
    tokenizer_files: list[str]
    bos_token_id: int | None
    eos_token_ids: list[int]
    weights_file: str
    graphs: list[GraphInfo]
    backbone_fingerprint: str
    draft: ModelInfo | None = None
    draft_source: dict[str, Any] | None = None
    created_by: str = ""
    schema_version: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)
    static: StaticVariants | None = None  # optional: bundles exported with --static
    coreml: CoreMLVariants | None = None  # optional: bundles exported with --coreml
    # "standard", or "shared-backbone": an edge bundle holding only head@backbone_layers, a
    # frozen draft cut from the target's lower layers, that needs a server to verify
    variant: str = "standard"
    backbone_layers: int | None = None
    # {"tokenizer": hex, "base": hex, "layers": [hex per layer]}: see edgespec.backbone
    backbone: dict[str, Any] | None = None
    # optional (bundles exported before chat support have none): the chat template and
    # generation defaults; chat calls refuse a bundle without a template
    chat: ChatFormat | None = None
    # optional (exported with --tree-verify): per dynamic role, its twin taking `position_ids`
    # [batch, sequence] int64 and `tree_mask` [sequence, sequence] bool, which verifies a token
    # tree in one forward (runtime/graphs/tree_verify.py)
    tree_graphs: list[GraphInfo] = field(default_factory=list)
    # target calls run a multiple of this many positions: 2 where activations are quantized
    # (runtime/graphs/stack.py). Absent in older bundles: 2 if their weights are quantized
    step_width: int = 1
    # optional: the layers whose residual streams `full` outputs as FEATURES [batch, sequence,
    # len * hidden] (float32), what the `eagle` graph drafts from (export/eagle.py); [] none
    feature_layers: list[int] = field(default_factory=list)

    def graph(self, role: str) -> GraphInfo:
        for g in self.graphs:
            if g.role == role:
                return g
        raise BundleError(
            f"this bundle has no '{role}' graph (it has: {', '.join(self.roles)}); "
            + _how_to_add(role)
        )

    @property
    def roles(self) -> list[str]:
        return [g.role for g in self.graphs]

    @property
    def exit_layers(self) -> list[int]:
        return sorted({g.exit_layer for g in self.graphs if g.role.startswith("head@")})

    def model_info(self, graph: GraphInfo | CoreMLPackage) -> ModelInfo:
        if graph.model == "draft":
            if self.draft is None:
                raise BundleError("manifest lists a draft graph but no draft model info")
            return self.draft
        return self.target

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        return {"format": FORMAT, **d}


def _how_to_add(role: str) -> str:
    if role == "eagle":
        return "add a feature head with `edgespec distill MODEL --out FOLDER`."
    if role == "draft":
        return "re-export with `edgespec export MODEL --draft DRAFT_MODEL`."
    if role.startswith(("head@", "tail@")):
        return f"re-export with `edgespec export MODEL --exit-layers {role.split('@')[1]}`."
    return "re-export the bundle with `edgespec export`."


def save_manifest(manifest: Manifest, folder: str | os.PathLike) -> Path:
    path = Path(folder) / MANIFEST
    path.write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
    return path


def load_manifest(folder: str | os.PathLike) -> Manifest:
    """Read and validate `folder/manifest.json`; raise BundleError with the fix on any problem."""
    folder = Path(folder)
    if not folder.exists():
        raise BundleError(
            f"bundle folder {folder} does not exist; create one with `edgespec export`"
        )
    if not folder.is_dir():
        raise BundleError(f"{folder} is a file, not a bundle folder made by `edgespec export`")
    path = folder / MANIFEST
    if not path.exists():
        raise BundleError(
            f"{folder} has no {MANIFEST}: it is not an edgespec bundle "
            "(make one with `edgespec export MODEL --out FOLDER`)"
        )
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise BundleError(f"{path} is not valid JSON ({e}); re-export the bundle") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise BundleError(f'{path} is not an edgespec manifest (no "format": "{FORMAT}")')
    version = raw.get("schema_version")
    if not isinstance(version, int):
        raise BundleError(f"{path} has no integer schema_version; re-export the bundle")
    if version > SCHEMA_VERSION:
        raise BundleError(
            f"{path} uses bundle schema {version}, newer than this edgespec understands "
            f"({SCHEMA_VERSION}); upgrade edgespec (`pip install -U edgespec`) or re-export "
            "the bundle with this version"
        )
    if version < 1:
        raise BundleError(f"{path} has an invalid schema_version {version}")
    try:
        manifest = _from_json(raw)
    except (KeyError, TypeError, ValueError) as e:
        raise BundleError(
            f"{path} is malformed ({type(e).__name__}: {e}); re-export the bundle"
        ) from None
    _check_files(manifest, folder)
    return manifest


def _graph_from_json(g: dict[str, Any]) -> GraphInfo:
    if not ROLE_PATTERN.match(g["role"]):
        raise ValueError(f"unknown graph role {g['role']!r}")
    layers = [int(i) for i in g["kv_layers"]]
    return GraphInfo(g["role"], g["file"], g["model"], layers, *_specs(g, "inputs", "outputs"))


def _specs(raw: dict[str, Any], *keys: str) -> list[list[TensorSpec]]:
    return [[TensorSpec(**t) for t in raw[k]] for k in keys]


def _from_json(raw: dict[str, Any]) -> Manifest:
    graphs = [_graph_from_json(g) for g in raw["graphs"]]
    variant = raw.get("variant", "standard")
    backbone_layers = raw.get("backbone_layers")
    if variant == "shared-backbone":
        if not isinstance(backbone_layers, int) or not raw.get("backbone"):
            raise ValueError("a shared-backbone bundle needs backbone_layers and backbone hashes")
        if f"head@{backbone_layers}" not in {g.role for g in graphs}:
            raise ValueError(f"a shared-backbone bundle needs its head@{backbone_layers} graph")
    elif variant != "standard":
        raise ValueError(f"unknown variant {variant!r} (standard | shared-backbone)")
    elif not any(g.role == "full" for g in graphs) and not any(
        g.role.startswith("tail@") for g in graphs
    ):
        raise ValueError("no 'full' or 'tail@k' graph: nothing can verify")
    feature_layers = [int(k) for k in raw.get("feature_layers", [])]
    full = next((g for g in graphs if g.role == "full"), None)
    if feature_layers and not (full and any(o.name == FEATURES for o in full.outputs)):
        raise ValueError("feature_layers are declared but the full graph outputs no features")
    if any(g.role == "eagle" for g in graphs) and not feature_layers:
        raise ValueError("an eagle graph needs the target's feature_layers")
    draft = raw.get("draft")
    gguf = str(raw.get("extra", {}).get("gguf", {}).get("weights", ""))  # its kept blocks
    quantized = "MatMulNBits" in gguf or raw.get("quantization") in ("int8", "int4", "qdq-int8")
    return Manifest(
        source=raw["source"],
        target=ModelInfo(**raw["target"]),
        dtype=raw["dtype"],
        quantization=raw.get("quantization"),
        tokenizer_files=list(raw["tokenizer_files"]),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=[int(i) for i in raw.get("eos_token_ids", [])],
        weights_file=raw["weights_file"],
        graphs=graphs,
        backbone_fingerprint=raw["backbone_fingerprint"],
        draft=ModelInfo(**draft) if draft else None,
        draft_source=raw.get("draft_source"),
        created_by=raw.get("created_by", ""),
        schema_version=raw["schema_version"],
        extra=raw.get("extra", {}),
        static=_static_from_json(raw.get("static")),
        coreml=_coreml_from_json(raw.get("coreml")),
        variant=variant,
        backbone_layers=backbone_layers,
        backbone=raw.get("backbone"),
        chat=_chat_from_json(raw.get("chat")),
        tree_graphs=[_graph_from_json(g) for g in raw.get("tree_graphs", [])],
        step_width=int(raw.get("step_width", 2 if quantized else 1)),
        feature_layers=feature_layers,
    )


def _chat_from_json(raw: dict[str, Any] | None) -> ChatFormat | None:
    if raw is None:
        return None
    templates = {str(k): str(v) for k, v in raw["templates"].items()}
    if not templates:
        raise ValueError("chat.templates is empty")
    return ChatFormat(
        templates=templates,
        special_tokens={str(k): str(v) for k, v in raw.get("special_tokens", {}).items()},
        generation=dict(raw.get("generation", {})),
    )


def _static_from_json(raw: dict[str, Any] | None) -> StaticVariants | None:
    if raw is None:
        return None
    widths = [int(w) for w in raw["verify_widths"]]
    graphs = [_graph_from_json(g) for g in raw["graphs"]]
    return StaticVariants(int(raw["max_context"]), widths, graphs)


def _coreml_from_json(raw: dict[str, Any] | None) -> CoreMLVariants | None:
    if raw is None:
        return None
    packages = []
    for p in raw["packages"]:
        if not ROLE_PATTERN.match(p["role"]):
            raise ValueError(f"unknown Core ML role {p['role']!r}")
        io = _specs(p, "inputs", "outputs", "states")
        layers = [int(i) for i in p["kv_layers"]]
        packages.append(CoreMLPackage(p["role"], p["path"], p["model"], layers, *io))
    return CoreMLVariants(int(raw["max_context"]), int(raw["verify_width"]), packages)


def _check_files(manifest: Manifest, folder: Path) -> None:
    needed = [manifest.weights_file, *manifest.tokenizer_files, *(g.file for g in manifest.graphs)]
    needed += [g.file for g in manifest.tree_graphs]
    if manifest.static is not None:
        needed += [g.file for g in manifest.static.graphs]
    if manifest.coreml is not None:
        needed += [p.path for p in manifest.coreml.packages]
    if manifest.chat is not None:
        needed += list(manifest.chat.templates.values())
    missing = [f for f in needed if not (folder / f).exists()]
    if missing:
        raise BundleError(
            f"bundle {folder} is incomplete: missing {', '.join(missing)}; "
            "copy the whole folder again or re-export it"
        )
