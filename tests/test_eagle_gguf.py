"""llama.cpp's EAGLE-3 heads imported (`edgespec export TARGET --eagle-gguf HEAD.gguf`): the eagle
graph computes what llama.cpp computes from the file's tensors (a numpy reference of
src/models/eagle3.cpp, its adjacent-pair rope on the permuted q/k rows, d2t's draft vocabulary),
the bundle declares the layers the head reads, greedy decoding with the head equals `ar`, and
files that are no head for this target are refused with the reason and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import edgespec
from edgespec.bundle import load_manifest
from edgespec.runtime.graphs.protocol import Feed

pytest.importorskip("gguf")

from tests.gguf_files import HEAD_DIM, HEADS, KV, byte_vocab, write_eagle3, write_gguf  # noqa: E402

VOCAB = len(byte_vocab()[0])
# head variants: a reduced draft vocabulary with its own LM head (layers out of order, one
# twice: fc's columns follow the file), and one on the target's LM head with both norm options
HEADS_KW = {
    "d2t": dict(layers=[2, 0, 2], draft_vocab=200, rope_base=5000.0),
    "shared": dict(
        layers=[1, 2, 0], own_output=False, norm_before_fc=True, norm_before_residual=True
    ),  # fmt: skip
    # Q8_0 blocks kept as the file's (their float compute: accuracy level 0), 8 query heads
    # over the target's 2 KV heads
    "q8": dict(layers=[0, 1, 2], draft_vocab=120, qtype="Q8_0", heads=8),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """(bundle, the head file's tensors) per (target family, head variant): the head's float
    matrices as float (exactly the file's), and once as the default int8 blocks."""
    from edgespec.export import export_bundle

    root = tmp_path_factory.mktemp("eagle_gguf")
    out = {}
    for family, variant in (("llama", "d2t"), ("qwen2", "shared"), ("llama", "q8")):
        target = root / f"{family}.gguf"
        if not target.exists():
            write_gguf(target, family)
        head = root / f"{variant}.gguf"
        tensors = write_eagle3(head, VOCAB, seed=3, **HEADS_KW[variant])
        bundle = root / f"{family}-{variant}"
        export_bundle(target, bundle, eagle_gguf=head, feature_layers=[1], draft_quantize="none",
                      accuracy_level=0)  # fmt: skip
        out[f"{family}-{variant}"] = (bundle, tensors)
    export_bundle(root / "llama.gguf", root / "int8", eagle_gguf=root / "d2t.gguf")
    out["llama-d2t-int8"] = (root / "int8", out["llama-d2t"][1])
    return out


# -- the reference: llama.cpp's eagle3 decoder in numpy, on the file's own tensors ----------
def rms(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * gamma


def rope_pairs(x: np.ndarray, base: float) -> np.ndarray:
    """ggml's rope mode 0 ("norm"): adjacent pairs (2i, 2i + 1) of each head rotate by
    position * base^(-2i / d). x: [positions, heads, d]."""
    n, _, d = x.shape
    theta = np.arange(n)[:, None] * base ** (-np.arange(0, d, 2) / d)  # [n, d / 2]
    cos, sin = np.cos(theta)[:, None], np.sin(theta)[:, None]
    out = x.copy()
    out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
    out[..., 1::2] = x[..., 0::2] * sin + x[..., 1::2] * cos
    return out


def rope_halves(x: np.ndarray, base: float) -> np.ndarray:
    """transformers' rotate-half rope (a Hugging Face checkpoint's q/k rows)."""
    n, _, d = x.shape
    theta = np.arange(n)[:, None] * base ** (-np.arange(0, d, 2) / d)
    cos, sin = np.cos(theta)[:, None], np.sin(theta)[:, None]
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)


def reference(t: dict, embed: np.ndarray, lm_head: np.ndarray, tokens, g: np.ndarray,
              rope=rope_pairs):  # fmt: skip
    """llama.cpp's head over positions 0..n-1 (token p + 1's id and g at each): the prenorm
    states [n, H] and logits over the target's vocabulary [n, V] (-inf off the draft's)."""
    m = t["meta"]
    eps, n, heads = m["eps"], len(tokens), m.get("heads", HEADS)
    e = embed[np.asarray(tokens)]
    g_n = rms(g, t["blk.0.attn_norm_2.weight"], eps)
    x = np.concatenate([rms(e, t["blk.0.attn_norm.weight"], eps), g_n], -1)
    q = rope((x @ t["blk.0.attn_q.weight"].T).reshape(n, heads, HEAD_DIM), m["base"])
    k = rope((x @ t["blk.0.attn_k.weight"].T).reshape(n, KV, HEAD_DIM), m["base"])
    v = (x @ t["blk.0.attn_v.weight"].T).reshape(n, KV, HEAD_DIM)
    k, v = np.repeat(k, heads // KV, 1), np.repeat(v, heads // KV, 1)
    s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(HEAD_DIM)
    s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    attn = np.einsum("hqk,khd->qhd", a, v).reshape(n, -1) @ t["blk.0.attn_output.weight"].T
    r = attn + (g_n if m["normed_residual"] else g)
    h = rms(r, t["blk.0.ffn_norm.weight"], eps)
    gate, up = h @ t["blk.0.ffn_gate.weight"].T, h @ t["blk.0.ffn_up.weight"].T
    r = r + (gate / (1 + np.exp(-gate)) * up) @ t["blk.0.ffn_down.weight"].T
    own = t.get("output.weight")
    logits = rms(r, t["output_norm.weight"], eps) @ (lm_head if own is None else own.T)
    if "d2t" in t:
        full = np.full((n, embed.shape[0]), -np.inf)
        full[:, t["d2t"]] = logits
        logits = full
    return r, logits


def fused(t: dict, f: np.ndarray) -> np.ndarray:
    """g from the target's states at the head's layers, in the head's order: [n, L * H]."""
    m = t["meta"]
    if m["normed_fc"]:
        f = rms(f, t["enc.output_norm.weight"], m["eps"])
    return f @ t["fc.weight"].T


@pytest.mark.parametrize("name", ["llama-d2t", "qwen2-shared", "llama-q8"])
def test_imported_head_graph_computes_llama_cpps_head(imported, name):
    from edgespec.export.gguf_model import read_gguf
    from edgespec.runtime.graphs.kv_cache import KVCache
    from edgespec.runtime.graphs.opener import open_bundle
    from edgespec.runtime.graphs.stack import Stack

    bundle, t = imported[name]
    m = load_manifest(bundle)
    assert m.feature_layers == [0, 1, 2] and "eagle" in m.roles
    target = read_gguf(m.source["model"]).weights
    embed, lm_head = np.asarray(target.embed), np.asarray(target.lm_head).T
    graphs = open_bundle(bundle)
    full, sess = Stack([graphs.open("full")]), graphs.open("eagle")
    rng = np.random.default_rng(1)
    ids = rng.integers(0, VOCAB, 14)
    full.reset(32)
    full.forward(ids, keep=1)
    n, hd = len(ids) - 1, 64
    feats = full.features[:n].copy()  # the bundle's layers 0, 1, 2
    full.forward(np.array([7]), keep=1)  # layer 0, the embeddings, in a one-position call too
    np.testing.assert_allclose(full.features[[0, n, n + 1], :hd], embed[[ids[0], ids[-1], 7]])
    mine = np.concatenate([feats[:, k * hd : (k + 1) * hd] for k in t["meta"]["layers"]], -1)
    g = fused(t, mine)
    states, want = reference(t, embed, lm_head, ids[1:], g)
    cache = KVCache.allocate([0], m.target.num_kv_heads, m.target.head_dim, 40, np.float32)
    out = sess.run(
        cache,
        0,
        Feed(input_ids=ids[None, 1:], keep=n),
        extra={"features": feats[None], "state": np.zeros((1, n, hd), np.float32)},
    )
    np.testing.assert_allclose(out["next_state"][0], states, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["logits"][0], want, rtol=1e-4, atol=1e-4)
    # a drafted position: the token drafted and the state of the position before
    cache.length = n
    drafted = int(np.argmax(want[-1]))
    step = sess.run(cache, n, Feed(input_ids=np.array([[drafted]]), keep=1),
                    extra={"features": np.zeros((1, 1, feats.shape[1]), np.float32),
                           "state": out["next_state"][:, -1:]})  # fmt: skip
    states2, want2 = reference(t, embed, lm_head, [*ids[1:], drafted],
                               np.concatenate([g, states[-1:]]))  # fmt: skip
    np.testing.assert_allclose(step["next_state"][0, 0], states2[-1], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(step["logits"][0, 0], want2[-1], rtol=1e-4, atol=1e-4)
    if "d2t" in t:  # drafts only the draft vocabulary, as target ids
        assert np.isneginf(step["logits"][0, 0]).sum() == VOCAB - len(t["d2t"])


PROMPTS = ["def f(x):\n    return", "the the the cat", "a b c a b"]


@pytest.mark.parametrize("name", ["llama-d2t", "qwen2-shared", "llama-q8", "llama-d2t-int8"])
@pytest.mark.parametrize("policy", ["fixed:3", "auto"])
def test_greedy_with_an_imported_head_equals_ar(imported, name, policy):
    bundle, t = imported[name]
    ar = edgespec.load(bundle, mode="ar")
    eagle = edgespec.load(bundle, mode="eagle", draft_policy=policy)
    chain = edgespec.load(bundle, drafter="lookup+eagle", draft_policy=policy)
    for prompt in PROMPTS:
        want = ar.generate(prompt, max_new_tokens=30, ignore_eos=True).tokens
        got = eagle.generate(prompt, max_new_tokens=30, ignore_eos=True)
        assert got.tokens == want
        assert chain.generate(prompt, max_new_tokens=30, ignore_eos=True).tokens == want
        if policy.startswith("fixed"):
            assert got.stats.drafted > 0


def test_an_imported_head_is_not_the_default_until_measured(imported):
    """No held-out acceptance or step cost yet: the default stays prompt lookup."""
    bundle, _ = imported["llama-d2t-int8"]
    record = load_manifest(bundle).extra["eagle"]["imported"]
    assert record["draft_vocab"] == 200 and record["quantize"] == "int8"
    assert edgespec.load(bundle).mode == "lookup"


def test_cli_export_takes_a_gguf_head(tmp_path):
    from edgespec.cli import main

    write_gguf(tmp_path / "t.gguf", "llama")
    write_eagle3(tmp_path / "h.gguf", VOCAB, [0, 1, 2])
    r = CliRunner().invoke(
        main,
        [
            "export",
            str(tmp_path / "t.gguf"),
            "--out",
            str(tmp_path / "b"),
            "--eagle-gguf",
            str(tmp_path / "h.gguf"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "eagle" in load_manifest(tmp_path / "b").roles
    r = CliRunner().invoke(main, ["inspect", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    row = next(x for x in r.output.splitlines() if x.startswith("feature head"))
    assert "h.gguf (llama.cpp EAGLE-3), target layers [0, 1, 2]" in row and "int8" in row


BAD = {
    "wrong arch": (dict(arch="llama"), "general.architecture='llama', not 'eagle3'"),
    "hidden size": (dict(target_hidden=32), "target_hidden_size is 32 but the target's hidden "
                    "size is 64: the head was made for another target"),
    "missing fc": (dict(drop=("fc.weight",)), "no tensor 'fc.weight'"),
    "missing q": (dict(drop=("blk.0.attn_q.weight",)), "no tensor 'blk.0.attn_q.weight'"),
    "layer": (dict(layers=[1, 2, 5]), r"target_layers \[1, 2, 5\] reads layer 5, but the target "
              "has 2 layers"),
    "no d2t": (dict(draft_vocab=100, drop=("d2t",)), "no d2t mapping them to target ids"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_a_file_that_is_no_head_for_this_target_is_refused_with_the_reason(tmp_path, case):
    from edgespec.export import ExportError, export_bundle

    kw, message = BAD[case]
    write_gguf(tmp_path / "t.gguf", "llama")
    write_eagle3(tmp_path / "h.gguf", VOCAB, **{"layers": [0, 1, 2], **kw})
    with pytest.raises(ExportError, match=message) as e:
        export_bundle(tmp_path / "t.gguf", tmp_path / "b", eagle_gguf=tmp_path / "h.gguf")
    assert "--eagle-gguf" in str(e.value) and not (tmp_path / "b").exists()


def test_a_hugging_face_target_takes_a_gguf_head(checkpoints, tmp_path):
    """The converter's default layers for a 4-layer target, [2, N // 2, N - 3]: one twice,
    out of order."""
    from edgespec.export import export_bundle

    write_eagle3(tmp_path / "h.gguf", 0, [2, 2, 1], own_output=False, norm_before_fc=True)
    export_bundle(checkpoints["qwen2"], tmp_path / "b", eagle_gguf=tmp_path / "h.gguf")
    assert load_manifest(tmp_path / "b").feature_layers == [1, 2]
    ar = edgespec.load(tmp_path / "b", mode="ar")
    eagle = edgespec.load(tmp_path / "b", mode="eagle", draft_policy="fixed:3")
    for prompt in PROMPTS:
        got = eagle.generate(prompt, max_new_tokens=30, ignore_eos=True)
        assert got.tokens == ar.generate(prompt, max_new_tokens=30, ignore_eos=True).tokens
        assert got.stats.drafted > 0


# a llama.cpp source tree (e.g. llama-cpp-python's vendor/llama.cpp): its own converter checked
LLAMA_CPP = os.environ.get("EDGESPEC_LLAMA_CPP")
# run its converter on a test tokenizer it does not know (its pre-tokenizer hash table), with
# sentencepiece stubbed where it is not installed (the converter imports it before it looks)
CONVERT = """
import importlib.machinery, importlib.util, runpy, sys, types
tree = sys.argv.pop(1)
sys.path[:0] = [tree, tree + "/gguf-py"]
if importlib.util.find_spec("sentencepiece") is None:
    stub = sys.modules["sentencepiece"] = types.ModuleType("sentencepiece")
    stub.__spec__ = importlib.machinery.ModuleSpec("sentencepiece", None)
    stub.SentencePieceProcessor = None
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
runpy.run_path(tree + "/convert_hf_to_gguf.py", run_name="__main__")
"""
HF_NAMES = {  # a Hugging Face EAGLE-3 checkpoint's names -> what llama.cpp names them
    "fc.weight": "fc.weight",
    "midlayer.input_layernorm.weight": "blk.0.attn_norm.weight",
    "midlayer.hidden_norm.weight": "blk.0.attn_norm_2.weight",
    "midlayer.self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "midlayer.self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "midlayer.self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "midlayer.self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "midlayer.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "midlayer.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "midlayer.mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "midlayer.mlp.down_proj.weight": "blk.0.ffn_down.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


@pytest.mark.skipif(not LLAMA_CPP, reason="EDGESPEC_LLAMA_CPP names no llama.cpp source tree")
def test_llama_cpps_own_conversion_of_a_hugging_face_head_imports_as_that_head(
    checkpoints, tmp_path
):
    """A Hugging Face EAGLE-3 checkpoint (EAGLE's layout: midlayer.*, d2t as offsets, t2d)
    through llama.cpp's convert_hf_to_gguf.py, then `--eagle-gguf`: the graph computes the
    checkpoint's own head (rotate-half rope on its unpermuted rows)."""
    import json

    from safetensors.numpy import load_file, save_file

    from edgespec.export import export_bundle
    from edgespec.runtime.graphs.kv_cache import KVCache
    from edgespec.runtime.graphs.opener import open_bundle
    from edgespec.runtime.graphs.stack import Stack

    target = checkpoints["llama-gqa-tied"]
    embed = load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"]
    vocab, hidden, draft_vocab = embed.shape[0], embed.shape[1], 300
    rng = np.random.default_rng(2)
    shapes = {
        "fc.weight": (hidden, 3 * hidden),
        "midlayer.self_attn.q_proj.weight": (64, 128),
        "midlayer.self_attn.k_proj.weight": (32, 128),
        "midlayer.self_attn.v_proj.weight": (32, 128),
        "midlayer.self_attn.o_proj.weight": (64, 64),
        "midlayer.mlp.gate_proj.weight": (128, 64),
        "midlayer.mlp.up_proj.weight": (128, 64),
        "midlayer.mlp.down_proj.weight": (64, 128),
        "lm_head.weight": (draft_vocab, 64),
    }
    hf = {k: (rng.standard_normal(shape) * 0.2).astype(np.float32) for k, shape in shapes.items()}
    for k in HF_NAMES:
        if k not in hf:  # the norms' gains
            hf[k] = (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)
    kept = np.sort(rng.choice(vocab, draft_vocab, replace=False))
    hf["d2t"] = (kept - np.arange(draft_vocab)).astype(np.int64)
    hf["t2d"] = np.isin(np.arange(vocab), kept)
    head = tmp_path / "head"
    head.mkdir()
    save_file(hf, str(head / "model.safetensors"))
    (head / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": hidden, "intermediate_size": 128, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": vocab,
        "draft_vocab_size": draft_vocab, "hidden_act": "silu", "tie_word_embeddings": False,
        "torch_dtype": "float32"}))  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-c", CONVERT, LLAMA_CPP, str(head), "--target-model-dir", str(target),
         "--outfile", str(tmp_path / "head.gguf"), "--outtype", "f32"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    bundle = tmp_path / "b"
    export_bundle(target, bundle, eagle_gguf=tmp_path / "head.gguf", draft_quantize="none")
    m = load_manifest(bundle)
    layers = m.extra["eagle"]["imported"]["target_layers"]
    assert layers == [2, 2, 1]  # the converter's [2, N // 2, N - 3] for a 4-layer target

    t = {HF_NAMES[k]: v for k, v in hf.items() if k in HF_NAMES}
    t["d2t"] = kept  # llama.cpp's absolute ids: HF's offsets plus the draft id
    t["meta"] = dict(eps=1e-5, base=10000.0, normed_residual=False)
    graphs = open_bundle(bundle)
    full, sess = Stack([graphs.open("full")]), graphs.open("eagle")
    ids = rng.integers(0, vocab, 12)
    full.reset(32)
    full.forward(ids, keep=1)
    n, fl = len(ids) - 1, m.feature_layers
    feats = full.features[:n].copy()
    mine = [feats[:, fl.index(k) * hidden : (fl.index(k) + 1) * hidden] for k in layers]
    g = np.concatenate(mine, -1) @ hf["fc.weight"].T
    states, want = reference(t, embed, embed.T, ids[1:], g, rope=rope_halves)
    cache = KVCache.allocate([0], 2, HEAD_DIM, 40, np.float32)
    zeros = np.zeros((1, n, hidden), np.float32)
    out = sess.run(cache, 0, Feed(input_ids=ids[None, 1:], keep=n),
                   extra={"features": feats[None], "state": zeros})  # fmt: skip
    np.testing.assert_allclose(out["next_state"][0], states, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["logits"][0], want, rtol=1e-4, atol=1e-4)


def test_a_shared_backbone_bundle_refuses_a_head_it_has_no_features_for(tmp_path):
    from edgespec.export import ExportConfig, ExportError

    with pytest.raises(ExportError, match="--eagle-gguf drafts from the full graph's features"):
        ExportConfig(variant="shared-backbone", backbone_layers=2, eagle_gguf=tmp_path / "h.gguf")
