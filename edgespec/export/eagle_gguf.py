"""An EAGLE-3 head in llama.cpp's GGUF -> the `HeadWeights` of the bundle's eagle graph
(export/eagle.py), for the target the head was made for (numpy and the `gguf` package).

The format is what llama.cpp's `--spec-type draft-eagle3` loads (`general.architecture`
"eagle3", written by convert_hf_to_gguf.py with --target-model-dir; src/models/eagle3.cpp
computes it, common/speculative.cpp feeds it). At head position p:

  f  = [h_l(p) for l in eagle3.target_layers]  the target's hidden states entering layer l
                                               (l = n_layer: the last layer's output before
                                               the final norm): edgespec's feature layer l
  g  = fc(f)                                   enc.output_norm(f) first if norm_before_fc; a
                                               drafted position: the state of the one before
  x  = [attn_norm(embed(token p+1)), attn_norm_2(g)]           2H wide: q, k, v read it
  r  = g + attn_output(attention(x))           attn_norm_2(g) + ... if norm_before_residual
  r += ffn_down(silu(ffn_gate(h)) * ffn_up(h)), h = ffn_norm(r)
  state = r;  logits = output(output_norm(r))  over the draft vocabulary; d2t (int64, absolute
                                               target ids) places them, -inf elsewhere
One layer (blk.0), rope "norm" (llama.cpp permuted q/k rows for adjacent-pair rotation: undone
here, as for llama targets), its own rope metadata, RMS eps and attention heads;
token_embd / output are the head's own where the file has them, else the target's.

Guarantees: a file that is not such a head, or not one for this target, is refused before
anything is written, with a ValueError naming the field or tensor and what to do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgespec.export.builder import AttentionShape
from edgespec.export.decoder import DecoderWeights, LayerWeights, Norm
from edgespec.export.eagle import HeadWeights
from edgespec.export.gguf_blocks import PackedMatrix
from edgespec.export.gguf_model import (
    _columns,
    _Reader,
    _rope_divisors,
    _unpermute,
    read_metadata,
    rotary,
)

ARCH = "eagle3"
WHAT = "an EAGLE-3 head as llama.cpp's convert_hf_to_gguf.py writes it (--target-model-dir)"


def read_eagle_gguf(
    path: str | Path, target: DecoderWeights, num_layers: int
) -> tuple[HeadWeights, dict[str, Any]]:
    """The head in `path` for `target` (its `num_layers` layers), and a record of it for the
    manifest; a ValueError naming what does not fit (module doc)."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError) as e:
        raise ValueError(f"{path} is not a readable GGUF file: {e}") from None
    meta = read_metadata(reader)
    arch = meta.get("general.architecture")
    if arch != ARCH:
        raise ValueError(
            f"general.architecture={arch!r}, not {ARCH!r}: --eagle-gguf takes {WHAT}; a "
            "whole model is a target (or, as a Hugging Face folder, a --draft)"
        )
    r = _Reader(reader, meta, ARCH)
    try:
        return _read(r, target, num_layers)
    except ValueError as e:
        raise ValueError(f"{e}; --eagle-gguf takes {WHAT}") from None


def _read(r: _Reader, target: DecoderWeights, num_layers: int) -> tuple[HeadWeights, dict]:
    hidden, vocab = int(target.embed.shape[1]), int(target.embed.shape[0])
    layers = [int(k) for k in r.key("target_layers", required=True)]
    bad = [k for k in layers if not 0 <= k <= num_layers]
    if bad or not layers:
        raise ValueError(
            f"eagle3.target_layers {layers} reads layer {bad[0] if bad else None}, but the "
            f"target has {num_layers} layers (0..{num_layers}): the head was made for another "
            "target; give the target it was converted with"
        )
    made_for = int(r.key("target_hidden_size", required=True))
    own = int(r.key("embedding_length", required=True))
    for what, size in (("eagle3.target_hidden_size", made_for), ("eagle3.embedding_length", own)):
        if size != hidden:
            raise ValueError(
                f"{what} is {size} but the target's hidden size is {hidden}: the head was made "
                "for another target; give the target it was converted with"
            )
    if int(r.key("block_count", required=True)) != 1:
        raise ValueError(f"eagle3.block_count is {r.key('block_count')}, not 1")
    heads = int(r.key("attention.head_count", required=True))
    kv = int(r.key("attention.head_count_kv", heads))
    head_dim = int(r.key("attention.key_length", own // heads))
    t = target.attn
    if (kv, head_dim) != (t.num_kv_heads, t.head_dim):
        raise ValueError(
            f"the head's attention has {kv} KV heads of {head_dim}, the target's "
            f"{t.num_kv_heads} of {t.head_dim}: edgespec keeps the head's cache in the "
            "target's shape, so it takes heads with the target's KV shape only"
        )
    eps = float(r.key("attention.layer_norm_rms_epsilon", required=True))
    fc = r.matrix("fc.weight")
    if tuple(fc.shape) != (len(layers) * hidden, own):
        raise ValueError(f"fc.weight is {tuple(fc.shape)}, not ({len(layers) * hidden}, {own})")

    def norm(name: str) -> Norm:
        return Norm(r.vector(name), None, eps)

    p = "blk.0."
    parts = []
    for tag, nh in (("q", heads), ("k", kv), ("v", kv)):
        m = r.matrix(f"{p}attn_{tag}.weight")
        if m.shape[0] != 2 * own:
            raise ValueError(f"{p}attn_{tag}.weight reads {m.shape[0]} inputs, not 2 x {own}")
        if tag != "v":  # llama.cpp's adjacent-pair rope rows back in rotate-half order
            order = _unpermute(nh, nh * head_dim)
            m = m.take_columns(order) if isinstance(m, PackedMatrix) else m[:, order]
        parts.append(m)
    layer = LayerWeights(
        attn_norm=None,
        qkv_w=_columns(parts),
        qkv_b=None,
        o_w=r.matrix(f"{p}attn_output.weight"),
        o_b=None,
        mlp_norm=norm(f"{p}ffn_norm.weight"),
        up_w=_columns([r.matrix(f"{p}ffn_gate.weight"), r.matrix(f"{p}ffn_up.weight")]),
        up_b=None,
        down_w=r.matrix(f"{p}ffn_down.weight"),
        down_b=None,
    )
    lm_head = r.matrix("output.weight") if r.has("output.weight") else None
    draft_ids = _draft_ids(r, vocab, lm_head)
    embed = None
    if r.has("token_embd.weight"):
        embed = r.matrix("token_embd.weight").T
        if embed.shape != target.embed.shape:
            raise ValueError(f"token_embd.weight is {tuple(embed.shape)}, the target's "
                             f"embeddings {tuple(target.embed.shape)}")  # fmt: skip
    positions = int(target.rotary[0].shape[0]) if target.rotary is not None else 0
    rot_dim = int(r.key("rope.dimension_count", head_dim))
    table = rotary(rot_dim, float(r.key("rope.freq_base", 10000.0)), positions,
                   _rope_divisors(r, rot_dim))  # fmt: skip
    same_rope = target.rotary is not None and all(
        a.shape == b.shape and np.array_equal(a, b)
        for a, b in zip(table, target.rotary, strict=True)
    )
    normed_fc = bool(r.key("norm_before_fc", False))
    head = HeadWeights(
        feature_layers=layers,
        fuse=fc,
        embed_norm=norm(f"{p}attn_norm.weight"),
        state_norm=norm(f"{p}attn_norm_2.weight"),
        proj=None,
        layer=layer,
        feature_norm=norm("enc.output_norm.weight") if normed_fc else None,
        residual_normed=bool(r.key("norm_before_residual", False)),
        final_norm=norm("output_norm.weight"),
        lm_head=lm_head,
        draft_ids=draft_ids,
        embed=embed,
        rotary=None if same_rope else table,
        attn=AttentionShape(heads, kv, head_dim, True),
    )
    record = {
        "format": "gguf eagle3 (llama.cpp draft-eagle3)",
        "target_layers": layers,
        "draft_vocab": int(draft_ids.shape[0]) if draft_ids is not None else vocab,
        "own_lm_head": lm_head is not None,
        "own_embeddings": embed is not None,
        "norm_before_fc": normed_fc,
        "norm_before_residual": head.residual_normed,
        "weights": dict(sorted(r.sources.items())),
    }
    return head, record


def _draft_ids(r: _Reader, vocab: int, lm_head: Any) -> np.ndarray | None:
    """d2t as the target id of each draft id (llama.cpp writes absolute ids), checked."""
    rows = int(lm_head.shape[1]) if lm_head is not None else vocab
    if not r.has("d2t"):
        if rows != vocab:
            raise ValueError(
                f"output.weight drafts over {rows} tokens, the target has {vocab}, and the "
                "file has no d2t mapping them to target ids"
            )
        return None
    t = r.tensors["d2t"]
    if t.tensor_type != r.qtype.I64:
        raise ValueError(f"d2t is {t.tensor_type.name}, not I64 (absolute target ids)")
    ids = np.asarray(t.data, np.int64).reshape(-1)
    if ids.shape[0] != rows:
        raise ValueError(f"d2t maps {ids.shape[0]} draft ids, the LM head drafts {rows}")
    if ids.min(initial=0) < 0 or ids.max(initial=0) >= vocab or np.unique(ids).size != ids.size:
        raise ValueError(
            f"d2t holds ids outside the target's vocabulary of {vocab} or repeats one: the "
            "head was made for another target"
        )
    return ids


class ImportedHead:
    """`config.eagle_gguf` read for the target, before any file is written: the head, its
    record and the bundle's feature layers (the config's and the head's)."""

    def __init__(self, config: Any, target: DecoderWeights, num_layers: int) -> None:
        from edgespec.export.errors import ExportError

        path = Path(config.eagle_gguf).expanduser()
        if not path.is_file():
            raise ExportError(f"--eagle-gguf {path} does not exist")
        try:
            self.head, self.record = read_eagle_gguf(path, target, num_layers)
        except ValueError as e:
            raise ExportError(f"--eagle-gguf {path.name}: {e}") from None
        self.record["file"] = path.name
        self.layers = sorted(set(config.feature_layers) | set(self.head.feature_layers))

    def write(self, out: Path, manifest: Any, target: DecoderWeights, config: Any) -> None:
        """The eagle graph into the bundle `out` and its entry into `manifest` (not saved)."""
        from edgespec.export.eagle import HEAD_QUANTIZE, write_head

        shared = config.quantize if config.quantize in ("int8", "int4") else None
        own = config.draft_quant.method if config.draft_quant is not None else None
        own = HEAD_QUANTIZE if config.draft_quantize is None else own
        self.record["quantize"] = own or "none"
        graph = write_head(out, target, self.head, config.dtype, bool(config.batched_verify),
                           config.accuracy_level, own, shared, self.layers)  # fmt: skip
        manifest.graphs = [g for g in manifest.graphs if g.role != "eagle"] + [graph]
        manifest.extra["eagle"] = {"imported": self.record}
