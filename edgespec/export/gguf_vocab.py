"""A GGUF file's tokenizer metadata -> the bundle's `tokenizer.json`, `tokenizer_config.json`
and chat format (what `edgespec.runtime.tokenizer` and the chat template renderer load).

Takes the metadata `gguf_model.read_metadata` read. `tokenizer.ggml.model`:

* "gpt2": byte-level BPE (SmolLM, Qwen, Llama 3, Granite, OLMo 2): vocabulary and merges as
  stored; the pre-tokenizer from `tokenizer.ggml.pre`, as llama.cpp splits text for that name
  (`PRE_TOKENIZERS`; e.g. "smollm" splits digits one by one before the GPT-2 regex);
* "llama": SentencePiece-style BPE with byte fallback (Llama 2, Mistral, Phi-3, Gemma): merges
  recovered from the token scores (Gemma: from the token order, as its scores do not follow
  its merges), a "▁" prefix when `tokenizer.ggml.add_space_prefix` (default true).

Tokens typed CONTROL become special added tokens, USER_DEFINED plain added ones; bos / eos
from their ids, `add_bos_token` / `add_eos_token` into the post-processor. The chat
template(s) `tokenizer.chat_template[.NAME]` go to the chat format. Anything else is a
`ValueError` naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgespec.bundle import ChatFormat
from edgespec.export.chat_format import TEMPLATE_DIR

CONTROL, USER_DEFINED = 3, 4
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level(split: str | None, digits: bool = False) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    if digits:
        steps.append({"type": "Digits", "individual_digits": True})
    if split is None:
        steps.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                      "use_regex": True})  # fmt: skip
    else:
        steps.append({"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated",
                      "invert": False})  # fmt: skip
        steps.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                      "use_regex": False})  # fmt: skip
    return {"type": "Sequence", "pretokenizers": steps}


# tokenizer.ggml.pre -> the pre-tokenizer llama.cpp applies for it (llama-vocab.cpp)
PRE_TOKENIZERS: dict[str, dict[str, Any]] = {
    **{k: _byte_level(None) for k in ("default", "gpt-2", "gpt2", "phi-2")},
    **{k: _byte_level(None, digits=True) for k in ("smollm", "starcoder", "refact")},
    **{
        k: _byte_level(_LLAMA3)
        for k in ("llama3", "llama-v3", "llama-bpe", "dbrx", "smaug-bpe", "falcon3")
    },  # fmt: skip
    **{k: _byte_level(_QWEN2) for k in ("qwen2", "deepseek-r1-qwen")},
}


def tokenizer_files(meta: dict[str, Any], arch: str) -> dict[str, Any]:
    """{file name: JSON object} for tokenizer.json and tokenizer_config.json."""
    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError("the GGUF file has no tokenizer.ggml.tokens: no vocabulary to export")
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    if kind == "gpt2":
        pre = meta.get("tokenizer.ggml.pre", "default")
        if pre not in PRE_TOKENIZERS:
            raise ValueError(
                f"tokenizer.ggml.pre={pre!r} is not supported by the GGUF importer; supported: "
                + ", ".join(sorted(PRE_TOKENIZERS))
            )
        merges = meta.get("tokenizer.ggml.merges")
        if not merges:
            raise ValueError("tokenizer.ggml.model='gpt2' with no tokenizer.ggml.merges")
        vocab = {t: i for i, t in enumerate(tokens)}
        model = {"type": "BPE", "vocab": vocab, "merges": list(merges), "byte_fallback": False}
        spec = {"normalizer": None, "pre_tokenizer": PRE_TOKENIZERS[pre],
                "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                            "use_regex": True}}  # fmt: skip
    elif kind == "llama":
        spec, model = _sentencepiece(meta, tokens, arch)
    else:
        raise ValueError(
            f"tokenizer.ggml.model={kind!r} is not supported by the GGUF importer; supported: "
            "gpt2 (byte-level BPE), llama (SentencePiece-style BPE)"
        )
    ids = {k: meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "unknown",
                                                                  "padding")}  # fmt: skip
    for k, i in ids.items():
        if i is not None and not 0 <= int(i) < len(tokens):
            raise ValueError(f"tokenizer.ggml.{k}_token_id={i} is outside the vocabulary")
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": ty == CONTROL}
        for i, (t, ty) in enumerate(zip(tokens, types, strict=True))
        if ty in (CONTROL, USER_DEFINED)
    ]  # fmt: skip
    if kind == "llama" and ids["unknown"] is not None:
        model["unk_token"] = tokens[int(ids["unknown"])]
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama"))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    single: list[dict[str, Any]] = []
    special: dict[str, Any] = {}
    for flag, key in ((add_bos, "bos"), (None, "A"), (add_eos, "eos")):
        if key == "A":
            single.append({"Sequence": {"id": "A", "type_id": 0}})
        elif flag and ids[key] is not None:
            tok = tokens[int(ids[key])]
            single.append({"SpecialToken": {"id": tok, "type_id": 0}})
            special[tok] = {"id": tok, "ids": [int(ids[key])], "tokens": [tok]}
    post = {"type": "TemplateProcessing", "single": single, "pair": single,
            "special_tokens": special}  # fmt: skip
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            **spec, "post_processor": post, "model": model}  # fmt: skip
    names = {"bos": "bos_token", "eos": "eos_token", "unknown": "unk_token",
             "padding": "pad_token"}  # fmt: skip
    config: dict[str, Any] = {names[k]: tokens[int(i)] for k, i in ids.items() if i is not None}
    config |= {"add_bos_token": add_bos, "add_eos_token": add_eos,
               "model_max_length": int(meta.get(f"{arch}.context_length", 0)) or None}  # fmt: skip
    return {"tokenizer.json": spec, "tokenizer_config.json": config}


def _sentencepiece(
    meta: dict[str, Any], tokens: list[str], arch: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    scores = meta.get("tokenizer.ggml.scores")
    if arch.startswith("gemma"):  # llama.cpp stores runs of spaces as spaces; order ranks merges
        tokens = ["▁" * len(t) if t and not t.strip(" ") else t for t in tokens]
        scores = [-float(i) for i in range(len(tokens))]
    if scores is None:
        raise ValueError("tokenizer.ggml.model='llama' with no tokenizer.ggml.scores")
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for piece, i in vocab.items():
        for cut in range(1, len(piece)):
            a, b = piece[:cut], piece[cut:]
            if a in vocab and b in vocab:
                merges.append((-float(scores[i]), vocab[a], vocab[b], a, b))
    merges.sort()
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
    norm = [{"type": "Prepend", "prepend": "▁"}] if prefix else []
    decoders: list[dict[str, Any]] = [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    if prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    spec = {
        "normalizer": {"type": "Sequence", "normalizers": [*norm, replace]},
        "pre_tokenizer": None,
        "decoder": {"type": "Sequence", "decoders": decoders},
    }
    model = {"type": "BPE", "vocab": vocab, "merges": [[m[3], m[4]] for m in merges],
             "byte_fallback": True, "fuse_unk": True, "ignore_merges": False}  # fmt: skip
    return spec, model


def chat_format(meta: dict[str, Any], config: dict[str, Any], out: Path) -> ChatFormat | None:
    """Write the file's chat template(s) under out/chat_templates/; the manifest's record."""
    templates = {"default": meta.get("tokenizer.chat_template")}
    prefix = "tokenizer.chat_template."
    templates |= {k[len(prefix) :]: v for k, v in meta.items() if k.startswith(prefix)}
    templates = {k: v for k, v in templates.items() if isinstance(v, str) and v}
    if not templates:
        return None
    (out / TEMPLATE_DIR).mkdir(exist_ok=True)
    files = {}
    for name, text in templates.items():
        if not name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"chat template name {name!r} is not a plain file name")
        rel = f"{TEMPLATE_DIR}/{name}.jinja"
        (out / rel).write_text(text, encoding="utf-8")
        files[name] = rel
    special = {k: v for k, v in config.items() if k.endswith("_token") and isinstance(v, str)}
    return ChatFormat(templates=files, special_tokens=special)


def write_tokenizer(files: dict[str, Any], out: Path) -> list[str]:
    for name, obj in files.items():
        (out / name).write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")
    return list(files)
