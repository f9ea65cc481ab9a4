"""Tiny random-weight GGUF files of every family the importer takes, written as llama.cpp's
converter writes them (the `gguf` package's writer and quantizers): q/k rows permuted for
llama / mistral / granite, Gemma's norm gains stored as 1 + w, Phi-3's fused qkv and gate|up,
a byte-level BPE vocabulary with merges and a chat template. `hf_weights` keeps the
transformers-layout originals (dequantized as the file holds them) for the tests to compare.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN, HEADS, KV, HEAD_DIM, INTER, LAYERS = 64, 4, 2, 16, 128, 2
FAMILIES = (
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "granite", "olmo2",
)  # fmt: skip
PERMUTED = ("llama", "mistral", "granite")
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_vocab() -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges, token types): 256 byte symbols, a few merges, three control tokens."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    tokens = [chr(c) for c in cs]
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "o n"]
    tokens += ["Ġt", "he", "Ġthe", "in", "Ġa", "on"]
    types = [1] * len(tokens)
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        tokens.append(special)
        types.append(3)
    return tokens, merges, types


def spm_vocab() -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) of a tiny SentencePiece-style vocabulary: unk, bos, eos,
    the 256 byte-fallback tokens, single letters and a few scored merges."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    pieces = ["▁", *"abcdefghijklmnopqrstuvwxyz", "▁t", "he", "▁the", "▁c", "at", "▁cat",
              "in", "▁in", "▁a", "on", "er", "▁on"]  # fmt: skip
    scores = [0.0] * len(tokens) + [-float(i) for i in range(len(pieces))]
    return tokens + pieces, scores, types + [1] * len(pieces)


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: transformers' rotate-half rows -> adjacent pairs."""
    n = w.shape[0]
    return w.reshape(heads, 2, n // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(
    path: Path,
    family: str,
    qtype: str = "F32",
    seed: int = 0,
    vocab_kind: str = "gpt2",
    mix: dict[str, str] | None = None,
) -> dict:
    """Write a tiny `family` GGUF with its matrices as `qtype` (`mix`: another type for the
    tensors whose name holds a key, e.g. {"attn_v": "Q8_0"}, as llama-quantize's mixes give
    some tensors more bits); return the transformers-layout weights as the file holds them
    (dequantized), by HF-style name."""
    import gguf
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(seed)
    arch = family
    if vocab_kind == "gpt2":
        tokens, merges, types = byte_vocab()
    else:
        tokens, scores, types = spm_vocab()
    vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(HEAD_DIM)
    if family in ("gemma2", "gemma3", "phi3"):
        w.add_sliding_window(8)
    if family == "gemma2":
        w.add_attn_logit_softcapping(50.0)
        w.add_final_logit_softcapping(30.0)
    if family == "granite":
        w.add_embedding_scale(2.0)
        w.add_residual_scale(0.5)
        w.add_attention_scale(0.2)
        w.add_logit_scale(4.0)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if vocab_kind == "gpt2":
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")
        w.add_token_merges(merges)
        w.add_bos_token_id(vocab - 2)
        w.add_eos_token_id(vocab - 1)
        w.add_pad_token_id(vocab - 1)  # else transformers' Phi-3 default pad id (32000) is used
        w.add_add_bos_token(False)
    else:
        w.add_tokenizer_model("llama")
        w.add_token_scores(scores)
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
    w.add_chat_template(TEMPLATE)
    hf: dict[str, np.ndarray] = {}
    default = qtype

    def matrix(name: str, hf_name: str, rows: int, cols: int, permute: int = 0) -> None:
        qtype = next((t for key, t in (mix or {}).items() if key in name), default)
        kind = getattr(gguf.GGMLQuantizationType, qtype)
        m = (rng.standard_normal((rows, cols)) * 0.2).astype(np.float32)
        data = _permute(m, permute) if permute and family in PERMUTED else m
        if qtype == "F32":
            stored = data
        elif qtype in ("F16", "BF16"):
            stored = quantize(data, kind)
        else:
            stored = quantize(data, kind)
        w.add_tensor(name, stored, raw_dtype=kind)
        held = dequantize(stored, kind).reshape(rows, cols) if qtype != "F32" else data
        hf[hf_name] = _permute_back(held, permute) if permute and family in PERMUTED else held

    def vector(name: str, hf_name: str, n: int, offset: float = 0.0) -> None:
        v = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        w.add_tensor(name, v + np.float32(offset))
        hf[hf_name] = v

    gemma = family.startswith("gemma")
    off = 1.0 if gemma else 0.0  # llama.cpp stores Gemma's gains as 1 + w
    matrix("token_embd.weight", "embed", vocab, HIDDEN)
    vector("output_norm.weight", "norm", HIDDEN, off)
    if family in ("llama", "qwen2"):  # untied heads for two of the families
        matrix("output.weight", "lm_head", vocab, HIDDEN)
    q, kv = HEADS * HEAD_DIM, KV * HEAD_DIM
    for i in range(LAYERS):
        p, h = f"blk.{i}.", f"layers.{i}."
        if family != "olmo2":
            vector(p + "attn_norm.weight", h + "attn_norm", HIDDEN, off)
            vector(p + "ffn_norm.weight", h + "mlp_norm", HIDDEN, off)
        if family in ("gemma2", "gemma3", "olmo2"):
            vector(p + "post_attention_norm.weight", h + "post_attn_norm", HIDDEN, off)
            vector(p + "post_ffw_norm.weight", h + "post_mlp_norm", HIDDEN, off)
        if family in ("qwen3", "gemma3"):
            vector(p + "attn_q_norm.weight", h + "q_norm", HEAD_DIM, off)
            vector(p + "attn_k_norm.weight", h + "k_norm", HEAD_DIM, off)
        if family == "olmo2":
            vector(p + "attn_q_norm.weight", h + "q_norm", q)
            vector(p + "attn_k_norm.weight", h + "k_norm", kv)
        if family == "phi3":
            matrix(p + "attn_qkv.weight", h + "qkv", q + 2 * kv, HIDDEN)
            matrix(p + "ffn_up.weight", h + "gate_up", 2 * INTER, HIDDEN)
        else:
            matrix(p + "attn_q.weight", h + "q", q, HIDDEN, permute=HEADS)
            matrix(p + "attn_k.weight", h + "k", kv, HIDDEN, permute=KV)
            matrix(p + "attn_v.weight", h + "v", kv, HIDDEN)
            matrix(p + "ffn_gate.weight", h + "gate", INTER, HIDDEN)
            matrix(p + "ffn_up.weight", h + "up", INTER, HIDDEN)
        if family == "qwen2":
            for t, n in (("q", q), ("k", kv), ("v", kv)):
                b = (0.1 * rng.standard_normal(n)).astype(np.float32)
                w.add_tensor(p + f"attn_{t}.bias", b)
                hf[h + f"{t}_bias"] = b
        matrix(p + "attn_output.weight", h + "o", HIDDEN, q)
        matrix(p + "ffn_down.weight", h + "down", HIDDEN, INTER)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


def _permute_back(w: np.ndarray, heads: int) -> np.ndarray:
    n = w.shape[0]
    return w.reshape(heads, n // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_eagle3(
    path: Path,
    vocab: int,
    layers: list[int],
    seed: int = 0,
    draft_vocab: int | None = None,
    own_output: bool = True,
    norm_before_fc: bool = False,
    norm_before_residual: bool = False,
    target_hidden: int = HIDDEN,
    rope_base: float = 10000.0,
    arch: str = "eagle3",
    drop: tuple[str, ...] = (),
    qtype: str = "F32",
    heads: int = HEADS,
) -> dict:
    """A tiny EAGLE-3 head as llama.cpp's converter writes it (conversion/llama.py): one layer
    whose q/k/v read 2 x hidden inputs, hidden_norm as attn_norm_2, fc over the target layers'
    states, q/k rows permuted, d2t as absolute target ids (int64) when `draft_vocab` is given
    (the draft vocabulary: a random subset of the target's), matrices as `qtype`. Returns
    the file's tensors by name in their numpy layout ([out, in], dequantized as the file holds
    them), d2t included, and its metadata."""
    import gguf
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(heads)
    w.add_head_count_kv(KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(rope_base)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_array(f"{arch}.target_layers", layers)
    w.add_uint32(f"{arch}.target_hidden_size", target_hidden)
    w.add_bool(f"{arch}.norm_before_residual", norm_before_residual)
    w.add_bool(f"{arch}.norm_before_fc", norm_before_fc)
    out: dict = {}

    kind = getattr(gguf.GGMLQuantizationType, qtype)

    def tensor(name: str, a: np.ndarray) -> None:
        if a.ndim == 2 and qtype != "F32":
            stored = quantize(a, kind)
            out[name] = dequantize(stored, kind).reshape(a.shape)
            if name not in drop:
                w.add_tensor(name, stored, raw_dtype=kind)
            return
        out[name] = a
        if name not in drop:
            w.add_tensor(name, a)

    def matrix(name: str, rows: int, cols: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def gains(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    q, kv = heads * HEAD_DIM, KV * HEAD_DIM
    tensor("fc.weight", matrix("fc", HIDDEN, len(layers) * target_hidden, 0.1))
    if norm_before_fc:
        tensor("enc.output_norm.weight", gains(len(layers) * target_hidden))
    tensor("blk.0.attn_norm.weight", gains(HIDDEN))
    tensor("blk.0.attn_norm_2.weight", gains(HIDDEN))
    tensor("blk.0.attn_q.weight", _permute(matrix("q", q, 2 * HIDDEN), heads))
    tensor("blk.0.attn_k.weight", _permute(matrix("k", kv, 2 * HIDDEN), KV))
    tensor("blk.0.attn_v.weight", matrix("v", kv, 2 * HIDDEN))
    tensor("blk.0.attn_output.weight", matrix("o", HIDDEN, q))
    tensor("blk.0.ffn_norm.weight", gains(HIDDEN))
    tensor("blk.0.ffn_gate.weight", matrix("gate", INTER, HIDDEN))
    tensor("blk.0.ffn_up.weight", matrix("up", INTER, HIDDEN))
    tensor("blk.0.ffn_down.weight", matrix("down", HIDDEN, INTER))
    tensor("output_norm.weight", gains(HIDDEN))
    if own_output:
        tensor("output.weight", matrix("output", draft_vocab or vocab, HIDDEN, 0.5))
    if draft_vocab is not None:
        d2t = np.sort(rng.choice(vocab, draft_vocab, replace=False)).astype(np.int64)
        out["d2t"] = d2t
        if "d2t" not in drop:
            w.add_tensor("d2t", d2t, raw_dtype=gguf.GGMLQuantizationType.I64)
    out["meta"] = dict(layers=layers, eps=1e-5, base=rope_base, normed_fc=norm_before_fc,
                       normed_residual=norm_before_residual, heads=heads)  # fmt: skip
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
