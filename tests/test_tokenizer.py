"""edgespec.runtime.tokenizer against the Hugging Face `tokenizers` library (the reference).

Small tokenizers are trained locally on Python standard-library source (no network), saved as
tokenizer.json, and our pure-Python encode/decode must match the library id for id.
"""

from __future__ import annotations

import json
import random
import sysconfig
import time
from pathlib import Path

import pytest

from edgespec.runtime.tokenizer import Tokenizer, TokenizerError, translate_regex

tokenizers = pytest.importorskip("tokenizers")  # the reference implementation (tests only)
Regex, decoders, models = tokenizers.Regex, tokenizers.decoders, tokenizers.models
normalizers, pre_tokenizers = tokenizers.normalizers, tokenizers.pre_tokenizers
processors, trainers = tokenizers.processors, tokenizers.trainers

GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
QWEN2_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

MULTILINGUAL = (
    "Café naïve façade — Ünïcödé! Ελληνικά κείμενα. Русский текст, ёжик.\n"
    "中文分词测试：你好，世界！日本語のテキストです。한국어 문장입니다.\n"
    "Emoji: 😀👍🏽🇫🇷 👨‍👩‍👧 and math ∑∫√π≈3.14159, ½ ¾ Ⅻ ²³ ٣٤٥ ߁߂.\n"
)


def _corpus() -> str:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts = [
        (stdlib / name).read_text(encoding="utf-8")[:6000]
        for name in ("textwrap.py", "json/decoder.py", "string.py", "bisect.py")
    ]
    return "\n".join(parts) + MULTILINGUAL * 3


CORPUS = _corpus()

SAMPLES = [
    "",
    " ",
    "Hello world",
    " Hello world",
    "Hello  world   ",
    "def f(x):\n    return x ** 2  # square\n\n\n\tprint(f(3))\r\n",
    "I'm sure you'll see it's what they've said, we'd ... THEY'RE 'S 'Ll",
    "numbers 1 12 123 1234 12345 3.14159 1,000,000 2024-01-31",
    "   leading spaces and trailing   \n\n  \n",
    "\n\n\n",
    "a\u3000b\u00a0c\u2003d\x0be\x0cf\x1cg\x1dh\x85i\u2028j",
    "tabs\t\tand\t newline\n\r\n mixed \t\n",
    "Café naïve façade — Ünïcödé! ÀÉÎÕÜ àéîõü",
    "e\u0301 o\u0308 combining marks, Z\u0351\u036b\u0343a\u0360l\u0357g\u0356o",
    "中文分词测试：你好，世界！日本語のテキストです。",
    "한국어 문장입니다. Ελληνικά. Русский текст.",
    "Emoji: 😀👍🏽🇫🇷 👨‍👩‍👧‍👦 🤖🚀✨",
    "math ∑∫√π≈3.14159, ½ ¾ Ⅻ ²³ ٣٤٥ ߁߂ ①②",
    "mixed123abc ABC123 abc_def __init__ x=1;y=2",
    "<|endoftext|>",
    "Hi<|endoftext|>there <|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
    " <|endoftext|> spaced <|endoftext|><|endoftext|>",
    "unknown <|im_sta rt|> <|endoftext",
    "\U0001d400\U0001d401 \U00010000 \uffff \ufffd",
    "ſ ß ﬁ İ ı K Å",
    'http://example.com/path?q=1&r=[2]#frag {"json": [1, 2, null]}',
]


def _random_strings(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    pool = (
        "abcXYZ019 '\t\n\r.,!?_-()[]{}<>éüßñ中文字😀🏽\u0301\u00a0\u3000\x0b\x1c½Ⅻ٣|"
        "<|endoftext|><|im_start|>"
    )
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 40))) for _ in range(count)]


def _byte_level_tokenizer(
    path: Path,
    split_re: str | None,
    *,
    add_prefix_space: bool = False,
    template: str | None = None,
    ignore_merges: bool = False,
) -> Path:
    """Train a byte-level BPE; split_re=None uses ByteLevel(use_regex=True) (GPT-2 style)."""
    tok = tokenizers.Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if split_re is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    else:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split_re), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=1200,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([CORPUS], trainer=trainer)
    if template:
        tok.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single=template, special_tokens=[("<|begin_of_text|>", 3)]
                ),
            ]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_tokens([tokenizers.AddedToken("<tool>", lstrip=True, rstrip=True, normalized=False)])
    tok.save(str(path))
    return path


def _sentencepiece_tokenizer(path: Path, *, metaspace: bool) -> Path:
    """A Llama-2 / TinyLlama-style BPE: byte_fallback, <0xNN> tokens, ▁ for spaces."""
    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=900, show_progress=False, special_tokens=["<unk>", "<s>", "</s>"]
    )
    tok.train_from_iterator([CORPUS.replace("中文", "")], trainer=trainer)
    spec = json.loads(tok.to_str())
    trained = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])[3:]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)}
    for token, _ in trained:
        vocab.setdefault(token, len(vocab))
    spec["model"]["vocab"] = vocab
    spec["model"]["merges"] += [["▁", "▁"], ["▁▁", "▁▁"]]  # merges across word boundaries
    vocab.setdefault("▁▁", len(vocab))
    vocab.setdefault("▁▁▁▁", len(vocab))
    for added in spec["added_tokens"]:
        added["id"] = vocab[added["content"]]
    if metaspace:  # newer conversions: Metaspace pre-tokenizer, no normalizer
        spec["normalizer"] = None
        spec["pre_tokenizer"] = {
            "type": "Metaspace",
            "replacement": "▁",
            "prepend_scheme": "first",
            "split": False,
        }
    else:  # legacy Llama-2 tokenizer.json
        spec["normalizer"] = {
            "type": "Sequence",
            "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
            ],
        }
        spec["pre_tokenizer"] = None
    spec["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ],
    }
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<s>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
    }
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tokenizers")


@pytest.fixture(
    scope="module", params=["gpt2", "gpt2_prefix", "qwen2", "llama3", "spm", "spm_meta"]
)
def pair(request: pytest.FixtureRequest, tok_dir: Path) -> tuple[Tokenizer, object]:
    path = tok_dir / f"{request.param}.json"
    if request.param == "gpt2":
        _byte_level_tokenizer(path, None)
    elif request.param == "gpt2_prefix":
        _byte_level_tokenizer(path, None, add_prefix_space=True)
    elif request.param == "qwen2":
        _byte_level_tokenizer(path, QWEN2_RE)
    elif request.param == "llama3":
        _byte_level_tokenizer(path, LLAMA3_RE, template="<|begin_of_text|> $A", ignore_merges=True)
    else:
        _sentencepiece_tokenizer(path, metaspace=request.param == "spm_meta")
    return Tokenizer.from_file(path), tokenizers.Tokenizer.from_file(str(path))


def test_encode_decode_match_reference(pair: tuple[Tokenizer, object]) -> None:
    ours, ref = pair
    for text in SAMPLES + _random_strings(0, 150) + [CORPUS[:3000]]:
        for special in (True, False):
            expected = ref.encode(text, add_special_tokens=special).ids
            assert ours.encode(text, add_special_tokens=special) == expected, (text, special)
        ids = ref.encode(text).ids
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(
                ids, skip_special_tokens=skip
            ), (text, skip)


def test_decode_arbitrary_ids_match_reference(pair: tuple[Tokenizer, object]) -> None:
    ours, ref = pair
    rng = random.Random(1)
    assert ours.vocab_size == ref.get_vocab_size(with_added_tokens=True)
    for _ in range(200):
        ids = [rng.randrange(ours.vocab_size) for _ in range(rng.randint(1, 12))]
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(
                ids, skip_special_tokens=skip
            ), ids


def test_stream_decoder_concatenation_equals_decode(pair: tuple[Tokenizer, object]) -> None:
    ours, _ = pair
    rng = random.Random(2)
    sequences = [ours.encode(t) for t in SAMPLES + [CORPUS[:2000]]]
    sequences += [[rng.randrange(ours.vocab_size) for _ in range(30)] for _ in range(100)]
    for ids in sequences:
        for skip in (True, False):
            stream = ours.stream_decoder(skip_special_tokens=skip)
            pieces = [stream.push(i) for i in ids] + [stream.flush()]
            assert "".join(pieces) == ours.decode(ids, skip_special_tokens=skip), ids


def test_stream_decoder_holds_incomplete_characters(tok_dir: Path) -> None:
    tok = Tokenizer.from_file(_byte_level_tokenizer(tok_dir / "hold.json", None))
    ids = tok.encode("a😀")  # the emoji is split across several byte tokens
    stream = tok.stream_decoder()
    pieces = [stream.push(i) for i in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + stream.flush() == "a😀"


def test_special_token_ids_and_config(tok_dir: Path) -> None:
    folder = tok_dir / "llama3_dir"
    folder.mkdir()
    _byte_level_tokenizer(folder / "tokenizer.json", LLAMA3_RE, template="<|begin_of_text|> $A")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|im_end|>"}})
    )
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    tok = Tokenizer.from_dir(folder)
    assert tok.bos_token_id == 3
    assert tok.eos_token_ids == [2, 0]
    assert tok.encode("hi")[0] == 3
    assert tok.encode("hi", add_special_tokens=False)[0] != 3
    assert tok.token_to_id("<|im_start|>") == 1 and tok.id_to_token(1) == "<|im_start|>"
    assert tok.decode(tok.encode("<|im_start|>x"), skip_special_tokens=True) == "x"


def test_regex_translation_matches_unicode_classes() -> None:
    import re
    import unicodedata

    letters = re.compile(translate_regex(r"\p{L}"))
    numbers = re.compile(translate_regex(r"[\p{N}]"))
    space = re.compile(translate_regex(r"\s"))
    for ch in "aZéß中ｱ\u02b0ǅ½Ⅻ٣3_ \x1c\u3000😀":
        assert bool(letters.fullmatch(ch)) == unicodedata.category(ch).startswith("L"), ch
        assert bool(numbers.fullmatch(ch)) == unicodedata.category(ch).startswith("N"), ch
    assert not space.match("\x1c") and space.match("\u3000") and space.match("\x85")
    pretok = pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated")
    ours = re.compile(translate_regex(QWEN2_RE))
    for text in SAMPLES:
        assert [m.group() for m in ours.finditer(text)] == [
            p for p, _ in pretok.pre_tokenize_str(text)
        ], text


def test_speed_5kb(pair: tuple[Tokenizer, object]) -> None:
    ours, _ = pair
    text = (CORPUS * 2)[:5000]
    ours.encode(text[:100])  # warm the regex / category tables
    ours._model.cache.clear()
    start = time.perf_counter()
    ours.encode(text)
    assert time.perf_counter() - start < 0.1


def _matrix_configs() -> dict[str, tuple]:
    """Less common components, each trained into a small tokenizer and checked against the
    library (normalized / single_word / lstrip / rstrip added tokens included)."""
    pt, nm, dec = pre_tokenizers, normalizers, decoders
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_level = pt.ByteLevel(add_prefix_space=False, use_regex=False)
    bpe_unk = models.BPE(unk_token="<unk>")
    return {
        "metaspace_always": (
            bpe_unk,
            None,
            pt.Metaspace(prepend_scheme="always"),
            dec.Metaspace(prepend_scheme="always"),
        ),
        "metaspace_never": (
            models.BPE(unk_token="<unk>", fuse_unk=True),
            None,
            pt.Metaspace(prepend_scheme="never"),
            dec.Metaspace(prepend_scheme="never"),
        ),
        "lower_whitespace": (
            bpe_unk,
            nm.Sequence([nm.NFKC(), nm.Lowercase(), nm.Strip()]),
            pt.Whitespace(),
            None,
        ),
        "subword_prefix": (
            models.BPE(unk_token="<unk>", continuing_subword_prefix="##"),
            nm.NFD(),
            pt.Sequence(
                [pt.WhitespaceSplit(), pt.Digits(individual_digits=True), pt.Punctuation()]
            ),
            None,
        ),
        "word_suffix": (
            models.BPE(unk_token="<unk>", end_of_word_suffix="</w>"),
            nm.Sequence([nm.NFD(), nm.StripAccents()]),
            pt.Sequence([pt.Whitespace(), pt.Digits()]),
            dec.BPEDecoder(),
        ),
        "split_removed_roberta": (
            models.BPE(),
            None,
            pt.Sequence([pt.Split(" ", "removed"), byte_level]),
            dec.ByteLevel(),
            processors.RobertaProcessing(("</s>", 2), ("<s>", 1)),
            alphabet,
        ),
        "split_prev": (
            models.BPE(),
            None,
            pt.Sequence(
                [
                    pt.Split(Regex(r"\s+"), "merged_with_previous"),
                    pt.ByteLevel(add_prefix_space=True, use_regex=False),
                ]
            ),
            dec.ByteLevel(),
            None,
            alphabet,
        ),
        "split_next_replace": (
            models.BPE(),
            nm.Replace(Regex(r"\d+"), "#"),
            pt.Sequence([pt.Split(Regex(r"[\p{P}\s]"), "merged_with_next"), byte_level]),
            dec.ByteLevel(),
            None,
            alphabet,
        ),
        "split_contiguous_invert": (
            models.BPE(),
            None,
            pt.Sequence([pt.Split(Regex(r"\p{L}+"), "contiguous", invert=True), byte_level]),
            dec.ByteLevel(),
            None,
            alphabet,
        ),
        "char_delimiter_strip": (
            models.BPE(unk_token="<unk>"),
            nm.Prepend("_"),
            pt.CharDelimiterSplit("e"),
            dec.Sequence([dec.Replace("_", " "), dec.Strip(" ", 0, 1)]),
        ),
    }


@pytest.mark.parametrize("name", list(_matrix_configs()))
def test_component_matrix_matches_reference(name: str, tmp_path: Path) -> None:
    model, norm, pre, dec, *rest = _matrix_configs()[name]
    ref = tokenizers.Tokenizer(model)
    if norm:
        ref.normalizer = norm
    ref.pre_tokenizer = pre
    if dec:
        ref.decoder = dec
    extra = {"initial_alphabet": rest[1]} if len(rest) > 1 else {}
    trainer = trainers.BpeTrainer(
        vocab_size=500, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False, **extra
    )
    ref.train_from_iterator([CORPUS[:8000]], trainer=trainer)
    if rest and rest[0]:
        ref.post_processor = rest[0]
    ref.add_tokens(
        [
            tokenizers.AddedToken("hello", single_word=True),
            tokenizers.AddedToken("World", normalized=True),
            tokenizers.AddedToken(" sp ", lstrip=True),
            tokenizers.AddedToken("<x>", special=True, rstrip=True, normalized=False),
        ]
    )
    ref.save(str(tmp_path / "tokenizer.json"))
    ours = Tokenizer.from_dir(tmp_path)
    rng = random.Random(3)
    pool = list(" \t\n\r\x0b\x1c\u3000\xa0abcXYZ019.,'!?_-()éüß中😀\u0301½Ⅻ٣ﬁK")
    words = ["hello", "World", "world", " sp ", "<x>", "<s>", "HELLO", "helloo"]
    texts = SAMPLES + [
        "".join(
            rng.choice(words) if rng.random() < 0.1 else rng.choice(pool)
            for _ in range(rng.randint(1, 40))
        )
        for _ in range(150)
    ]
    for text in texts:
        ids = ref.encode(text).ids
        assert ours.encode(text) == ids, text
        for skip in (False, True):
            expected = ref.decode(ids, skip_special_tokens=skip)
            assert ours.decode(ids, skip_special_tokens=skip) == expected, (text, skip)
            stream = ours.stream_decoder(skip_special_tokens=skip)
            assert "".join([stream.push(i) for i in ids] + [stream.flush()]) == expected


def test_merges_as_strings_and_pairs(tok_dir: Path) -> None:
    path = _byte_level_tokenizer(tok_dir / "pairs.json", QWEN2_RE)
    spec = json.loads(path.read_text(encoding="utf-8"))
    spec["model"]["merges"] = [" ".join(m) for m in spec["model"]["merges"]]
    strings = tok_dir / "strings.json"
    strings.write_text(json.dumps(spec), encoding="utf-8")
    ref = tokenizers.Tokenizer.from_file(str(path))
    for p in (path, strings):
        tok = Tokenizer.from_file(p)
        assert tok.encode(CORPUS[:4000]) == ref.encode(CORPUS[:4000]).ids


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="not found"):
        Tokenizer.from_file(tmp_path / "missing.json")
    with pytest.raises(TokenizerError, match="not found"):
        Tokenizer.from_dir(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TokenizerError, match="JSON"):
        Tokenizer.from_file(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(TokenizerError, match="model"):
        Tokenizer.from_file(bad)
    for kind in ("WordPiece", "Unigram", "WordLevel"):
        bad.write_text(json.dumps({"model": {"type": kind, "vocab": {}}}))
        with pytest.raises(TokenizerError, match=f"{kind}.*only BPE"):
            Tokenizer.from_file(bad)
    bad.write_text(
        json.dumps(
            {
                "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                "normalizer": {"type": "Precompiled"},
            }
        )
    )
    with pytest.raises(TokenizerError, match="Precompiled"):
        Tokenizer.from_file(bad)
    bad.write_text(
        json.dumps(
            {
                "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                "pre_tokenizer": {
                    "type": "Split",
                    "behavior": "Isolated",
                    "pattern": {"Regex": r"\p{Han}+"},
                },
            }
        )
    )
    with pytest.raises(TokenizerError, match="Han"):
        Tokenizer.from_file(bad)
    bad.write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}))
    with pytest.raises(TokenizerError, match="merge"):
        Tokenizer.from_file(bad)
    bad.write_text(
        json.dumps(
            {
                "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                "added_tokens": [{"content": "x"}],
            }
        )
    )
    with pytest.raises(TokenizerError, match="malformed"):
        Tokenizer.from_file(bad)
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}}))
    tok = Tokenizer.from_file(ok)
    assert tok.encode("ab") == [0, 1] and tok.decode([0, 1]) == "a b"
    with pytest.raises(TokenizerError, match=r"id 7 .*vocab_size=2"):
        tok.decode([0, 7])
    with pytest.raises(TokenizerError, match="id -1"):
        tok.stream_decoder().push(-1)
