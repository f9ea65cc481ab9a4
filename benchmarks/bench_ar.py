"""Plain autoregressive (greedy) decoding speed: edgespec `ar` vs transformers vs onnxruntime-genai.

What it measures, for random-weight models with the shapes of real small LLMs
(SmolLM2-135M: Llama, 30 layers, hidden 576; Qwen2.5-0.5B: Qwen2, 24 layers, hidden 896;
Qwen3-0.6B: q/k norms, 28 layers, hidden 1024; Gemma-3-1B: sliding/global layers, q/k norms,
26 layers, hidden 1152, a 262k vocabulary), all fp32 on the CPU, with the same prompt ids,
the same thread count and the same number of new tokens in one run:

* prefill tokens/s: prompt tokens / time from the start of the prompt forward pass to the
  first new token (the prompt pass plus choosing token 1);
* decode tokens/s: (N - 1) / time from the first new token to the N-th one, so the prefill is
  never part of it. How each engine is timed:
    - edgespec: its own `res.stats` (`prefill_seconds` covers the prompt pass and token 1,
      `decode_seconds` the remaining `decode_tokens` one-token passes);
    - transformers: `generate(do_sample=False)` with a streamer that timestamps every `put`:
      the first `put` is the prompt (just before the prefill), the second is token 1 (end of
      prefill), the last is token N; decode = last - second;
    - onnxruntime-genai: `append_tokens(prompt)` + the first `generate_next_token()` are the
      prefill (append_tokens runs the prompt pass, the first call only picks token 1), the
      other N - 1 `generate_next_token()` calls are the decode;
* the memory-bandwidth bound: bytes of weights read per decoded token (every weight tensor
  except the embedding table, whose one-row gather is free, plus the LM head, which for
  tied embeddings is that same table) divided by the machine's memory bandwidth -> an upper
  bound on decode tokens/s. Bandwidth: best of 5 over a 1 GiB buffer split across the same
  T threads the engines get, max of a `np.copyto` (counted STREAM-style as bytes read +
  bytes written) and a `np.sum` (bytes read); optimistic on purpose. (A single-threaded copy
  alone gives a "bound" that genai beats with 2 threads.) KV-cache reads are ignored.
* "same tokens": how many leading new tokens of each engine equal transformers' greedy
  tokens (random weights: tiny numeric differences may flip a late token, so it is
  reported, not asserted).

Every engine produces exactly N tokens: transformers with EOS stopping disabled (generation
config `eos_token_id=None`), edgespec with `ignore_eos=True`, genai with
`min_length = max_length = prompt + N` (genai has no "ignore EOS"; its min_length masks the
EOS logit, which changes a token only where EOS would have been the argmax).

Checkpoints (config + random weights from a fixed torch seed + a byte-level BPE tokenizer
trained on Python's stdlib source; the model keeps its real vocab size and the tokenizer gets
`<unused_ID>` placeholder entries up to it, since random weights do emit those ids), the
genai export (its model builder, run offline on the local folder) and the edgespec bundle
(re-exported when edgespec's exporter source changes) are cached under `--cache` (default
~/.cache/edgespec-bench). The prompt is 64 random ids below the trained vocab (fixed seed).

On a shared machine each timed run first waits (up to `--quiet-wait` s) for a second in which
other processes leave the CPU idle, and records how many cores they used during the run; a
row whose runs were disturbed says so ("busy machine: ...").

Run (in the project venv; genai lives in its own venv, so it runs in a subprocess there):

    python benchmarks/bench_ar.py --genai-python /work/venv-genai/bin/python \\
        --threads 2 --new-tokens 64 --repeats 3 --json /tmp/bench_ar.json

If `onnxruntime_genai` is importable in the running interpreter, everything runs in one
process (leave out --genai-python). `--engines transformers,edgespec` picks a subset,
`--shapes smollm2-135m` one shape, `--rebuild edgespec` re-exports cached artifacts.
`--precisions fp32,int8,int4,int4@32` adds edgespec rows at other precisions (int4@32: the
export's int4 with blocks of 32 instead of its default) and llama.cpp's matching F32/Q8_0/Q4_0
rows (`--engines llamacpp`); `--rounds 3` runs the whole list three times in turns.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from common import BENCH_CACHE, REPO, base_precision, loadavg, worker_answer
from llamacpp_engine import BYTES_PER_WEIGHT

ENGINES = ("edgespec", "transformers", "genai", "llamacpp")
PRECISIONS = ("fp32", "fp16", "int8", "int4")  # edgespec's names; llama.cpp: F32 F16 Q8_0 Q4_0


def block_of(precision: str) -> int | None:
    """The block an "int8@128"-style precision names (None: the export's default)."""
    return int(precision.split("@", 1)[1]) if "@" in precision else None


QUIET_CORES = 0.25  # other processes' CPU use (cores) above which the machine counts as busy
TOKENIZER_VOCAB = 8192  # trained BPE vocab; prompt ids are drawn below it
EOS_TOKEN = "<|endoftext|>"  # id 0 of the trained tokenizer; also the models' bos/eos/pad

# name -> (transformers config class, config kwargs). Shapes copied from the real models.
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "smollm2-135m": (
        "LlamaConfig",
        dict(
            hidden_size=576,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            intermediate_size=1536,
            vocab_size=49152,
            tie_word_embeddings=True,
            max_position_embeddings=2048,
            rope_theta=100000.0,
        ),
    ),
    "qwen2.5-0.5b": (
        "Qwen2Config",
        dict(
            hidden_size=896,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            intermediate_size=4864,
            vocab_size=151936,
            tie_word_embeddings=True,
            max_position_embeddings=32768,
            rope_theta=1000000.0,
        ),
    ),
    "qwen3-0.6b": (
        "Qwen3Config",
        dict(
            hidden_size=1024,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=3072,
            vocab_size=151936,
            tie_word_embeddings=True,
            max_position_embeddings=40960,
            rope_theta=1000000.0,
        ),
    ),
    "gemma3-1b": (
        "Gemma3TextConfig",
        dict(
            hidden_size=1152,
            num_hidden_layers=26,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=256,
            intermediate_size=6912,
            vocab_size=262144,
            tie_word_embeddings=True,
            max_position_embeddings=32768,
            sliding_window=512,
            query_pre_attn_scalar=256,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            },
        ),
    ),
}
SHAPE_TITLES = {
    "smollm2-135m": "SmolLM2-135M shape",
    "qwen2.5-0.5b": "Qwen2.5-0.5B shape",
    "qwen3-0.6b": "Qwen3-0.6B shape",
    "gemma3-1b": "Gemma-3-1B shape (sliding window 512, 5 local : 1 global)",
}


# --------------------------------------------------------------------------- measurements
@dataclass
class Run:
    """One timed generation."""

    prefill_s: float
    decode_s: float
    prompt_tokens: int
    decode_tokens: int  # tokens after the first one
    tokens: list[int]
    wall_s: float = 0.0  # the whole call, setup included, for sanity checks
    other_cpu: float = 0.0  # mean cores other processes kept busy during this run

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0


@dataclass
class EngineResult:
    engine: str
    precision: str = "fp32"
    status: str = "ok"  # "ok" | "skipped" | "error"
    message: str = ""
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    same_tokens: int | None = None  # leading new tokens equal to the reference's
    same_as: str = ""  # the reference: transformers at fp32, else the other engine (same precision)
    tokens: list[int] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0  # export (if not cached) + load + warm-up + repeats
    round_decode_tps: list[float] = field(default_factory=list)  # median decode of each round
    other_cpu: float = 0.0  # most cores other processes kept busy during a counted run


def measure(
    once: Callable[[], Run], warmup: int, repeats: int, quiet_wait: float, retries: int = 0
) -> list[Run]:
    """Warm up, then time `repeats` runs, each started when the machine is quiet (or after
    `quiet_wait` seconds of waiting for that) and tagged with the CPU others used meanwhile;
    up to `retries` extra runs replace runs that other processes disturbed."""
    wait_for_quiet(quiet_wait)
    for _ in range(warmup):
        once()
    runs: list[Run] = []
    while len(runs) < repeats + retries and sum(map(undisturbed, runs)) < repeats:
        wait_for_quiet(quiet_wait)
        monitor = CpuMonitor()
        start = time.perf_counter()
        run = once()
        run.wall_s = time.perf_counter() - start
        run.other_cpu = monitor.other_cores()
        runs.append(run)
    return runs


def undisturbed(run: Run) -> bool:
    return run.other_cpu <= QUIET_CORES


def counted(runs: list[Run]) -> list[Run]:
    """The runs a row's figures come from: the undisturbed ones, or all if every one was."""
    return [r for r in runs if undisturbed(r)] or runs


def summarize(result: EngineResult, runs: list[Run], stat: str, n_new: int) -> None:
    """Median (or best) over the undisturbed runs, or over all runs if every one was."""
    pick: Callable[[list[float]], float] = max if stat == "best" else statistics.median
    used = counted(runs)
    result.prefill_tps = pick([r.prefill_tps for r in used])
    result.decode_tps = pick([r.decode_tps for r in used])
    result.tokens = runs[0].tokens
    result.runs = [
        {
            "prefill_s": r.prefill_s,
            "decode_s": r.decode_s,
            "prompt_tokens": r.prompt_tokens,
            "decode_tokens": r.decode_tokens,
            "wall_s": r.wall_s,
            "other_cpu": r.other_cpu,
            "used": any(r is u for u in used),
            "prefill_tps": r.prefill_tps,
            "decode_tps": r.decode_tps,
        }
        for r in runs
    ]
    counts = {len(r.tokens) for r in runs}
    notes = []
    if counts != {n_new}:
        notes.append(f"produced {sorted(counts)} tokens, not {n_new}")
    if any(r.tokens != runs[0].tokens for r in runs):
        notes.append("tokens differ between repeats")
    result.other_cpu = max(r.other_cpu for r in used)
    if result.other_cpu > QUIET_CORES:
        notes.append(f"busy machine: other jobs used up to {result.other_cpu:.1f} cores")
    elif len(used) < len(runs):
        notes.append(f"{len(runs) - len(used)} disturbed run(s) left out")
    if notes:
        result.message = "; ".join(notes)


def leading_match(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# --------------------------------------------------------------------------- checkpoints
def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:10]


def _stdlib_texts() -> Iterator[str]:
    import sysconfig

    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        yield path.read_text(encoding="utf-8", errors="replace")


def train_tokenizer(cache: Path) -> Path:
    """A byte-level BPE trained on the stdlib's top-level modules (cached tokenizer.json)."""
    folder = cache / f"tokenizer-bpe{TOKENIZER_VOCAB}"
    path = folder / "tokenizer.json"
    if path.exists():
        return path
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_stdlib_texts(), trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tok.save(str(tmp))
    tmp.replace(path)
    return path


def padded_tokenizer(path: Path, vocab_size: int) -> Any:
    """The trained tokenizer with placeholder entries up to the model's vocab size.

    Random weights happily emit ids above the trained vocab; `<unused_ID>` entries (reachable
    by no merge, so encoding is unchanged) let every engine's detokenizer handle them.
    """
    from tokenizers import Tokenizer

    spec = json.loads(path.read_text(encoding="utf-8"))
    vocab: dict[str, int] = spec["model"]["vocab"]
    for i in range(len(vocab), vocab_size):
        vocab[f"<unused_{i}>"] = i
    return Tokenizer.from_str(json.dumps(spec))


def shape_slug(shape: str, seed: int) -> str:
    cls, kwargs = SHAPES[shape]
    return f"{shape}-seed{seed}-{_digest([cls, kwargs, TOKENIZER_VOCAB, 'v2'])}"


def build_checkpoint(shape: str, seed: int, cache: Path, rebuild: bool) -> Path:
    """Write a complete HF checkpoint folder (config, random weights, tokenizer) once."""
    folder = cache / shape_slug(shape, seed) / "hf"
    stamp = folder / ".complete"
    if stamp.exists() and not rebuild:
        return folder
    import torch
    import transformers

    tok_path = train_tokenizer(cache)
    shutil.rmtree(folder, ignore_errors=True)
    cls_name, kwargs = SHAPES[shape]
    config = getattr(transformers, cls_name)(
        **kwargs, bos_token_id=0, eos_token_id=0, pad_token_id=0
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    del model
    gc.collect()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=padded_tokenizer(tok_path, config.vocab_size),
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
    )
    fast.save_pretrained(folder)
    stamp.write_text(json.dumps({"shape": shape, "seed": seed}))
    return folder


def weight_bytes_per_token(folder: Path) -> tuple[int, int]:
    """(total parameters, bytes of weights read per decoded token) from safetensors headers.

    Every tensor is read once per token except the embedding table (one row gathered); the
    LM head is read in full, and for tied embeddings it *is* the embedding table.
    """
    sizes = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}
    tensors: dict[str, tuple[int, int]] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for name, info in header.items():
            if name != "__metadata__":
                tensors[name] = (int(np.prod(info["shape"])), sizes[info["dtype"]])
    embed = next(n for n in tensors if n.endswith("embed_tokens.weight"))
    params = sum(n for n, _ in tensors.values())
    read = sum(n * b for name, (n, b) in tensors.items() if name != embed)
    if not any(name.startswith("lm_head") for name in tensors):  # tied: head = embedding
        read += tensors[embed][0] * tensors[embed][1]
    return params, read


def prompt_ids(seed: int, length: int) -> list[int]:
    """Random ids from the trained part of the vocab (id 0, the EOS, excluded)."""
    rng = np.random.default_rng(seed)
    return [int(i) for i in rng.integers(1, TOKENIZER_VOCAB, size=length)]


# --------------------------------------------------------------------------- bandwidth
def memory_bandwidth(nbytes: int, threads: int, repeats: int = 5) -> dict[str, float]:
    """Best-of-`repeats` bandwidths in bytes/s over an `nbytes` buffer split across `threads`
    Python threads (numpy drops the GIL), so the test uses as many cores as the engines:

    * copy: `np.copyto`, counted STREAM-style as bytes read + bytes written;
    * read: `np.sum` (a pure streaming read, no BLAS threads involved).
    """
    from concurrent.futures import ThreadPoolExecutor

    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch every page first
    edges = np.linspace(0, src.size, threads + 1, dtype=np.int64)
    parts = list(zip(edges[:-1], edges[1:], strict=True))

    def best(work: Callable[[int, int], object]) -> float:
        fastest = float("inf")
        with ThreadPoolExecutor(threads) as pool:
            for _ in range(repeats):
                start = time.perf_counter()
                list(pool.map(lambda ab: work(*ab), parts))
                fastest = min(fastest, time.perf_counter() - start)
        return fastest

    copy = 2 * nbytes / best(lambda a, b: np.copyto(dst[a:b], src[a:b]))
    read = nbytes / best(lambda a, b: src[a:b].sum())
    return {"copy": copy, "read": read, "bound": max(copy, read)}


# --------------------------------------------------------------------------- engines
@contextmanager
def transformers_engine(
    folder: Path, prompt: list[int], n_new: int, threads: int
) -> Iterator[Callable[[], Run]]:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.generation.streamers import BaseStreamer

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # never stop early: always N tokens
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=n_new,
        min_new_tokens=0,
        eos_token_id=None,
        pad_token_id=0,
        num_beams=1,
    )
    input_ids = torch.tensor([prompt], dtype=torch.long)
    attention_mask = torch.ones_like(input_ids)

    class Clock(BaseStreamer):
        """Timestamps each streamer.put: the prompt, then every new token as it is chosen."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def put(self, value: Any) -> None:
            self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    def once() -> Run:
        clock = Clock()
        with torch.inference_mode():
            out = model.generate(
                input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                streamer=clock,
            )
        tokens = [int(t) for t in out[0, len(prompt) :]]
        t = clock.times  # [prompt, token 1, ..., token N]
        return Run(
            prefill_s=t[1] - t[0],
            decode_s=t[-1] - t[1],
            prompt_tokens=len(prompt),
            decode_tokens=len(t) - 2,
            tokens=tokens,
        )

    yield once  # the model is freed with this generator's frame; run_engine then collects


def export_edgespec(folder: Path, bundle: Path, precision: str = "fp32") -> None:
    """fp32 / fp16 weights, or fp32 with int8 / int4 MatMulNBits weights (the export's
    default block, or the one an "int4@32"-style precision names)."""
    from edgespec.export import export_bundle

    shutil.rmtree(bundle, ignore_errors=True)
    options: dict[str, Any] = {"dtype": "fp16" if precision == "fp16" else "fp32"}
    if base_precision(precision) in ("int8", "int4"):
        options.update(quantize=base_precision(precision), block_size=block_of(precision))
    export_bundle(model=str(folder), out=str(bundle), **options)


def edgespec_exporter_digest() -> str:
    """Hash of the exporter's source: a cached bundle is re-exported when the exporter changed."""
    import edgespec

    root = Path(edgespec.__file__).parent
    h = hashlib.sha256()
    for path in sorted([root / "bundle.py", *(root / "export").rglob("*.py")]):
        if path.exists():
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def load_edgespec(bundle: Path, threads: int) -> Any:
    import edgespec

    return edgespec.load(str(bundle), threads=threads)


def edgespec_runner(model: Any, prompt: list[int], n_new: int) -> Callable[[], Run]:
    def once() -> Run:
        res = model.generate(list(prompt), max_new_tokens=n_new, ignore_eos=True)
        s = res.stats
        return Run(
            prefill_s=s.prefill_seconds,
            decode_s=s.decode_seconds,
            prompt_tokens=s.prefill_tokens,
            decode_tokens=s.decode_tokens,
            tokens=[int(t) for t in res.tokens],
        )

    return once


def export_genai(folder: Path, out: Path, python: str) -> None:
    """Run genai's model builder on the local folder, offline, fp32 for the CPU."""
    shutil.rmtree(out, ignore_errors=True)
    scratch = out.parent / "genai-builder-cache"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    cmd = [
        python, "-m", "onnxruntime_genai.models.builder",
        "-i", str(folder), "-o", str(out), "-p", "fp32", "-e", "cpu", "-c", str(scratch),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    shutil.rmtree(scratch, ignore_errors=True)
    if proc.returncode != 0 or not (out / "genai_config.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RuntimeError(f"genai model builder failed ({' '.join(cmd)}):\n{tail}")


def set_genai_threads(out: Path, threads: int) -> None:
    """Threads are a genai_config.json setting: decoder.session_options.intra_op_num_threads."""
    path = out / "genai_config.json"
    config = json.loads(path.read_text())
    options = config["model"]["decoder"].setdefault("session_options", {})
    options["intra_op_num_threads"] = threads
    options["inter_op_num_threads"] = 1
    path.write_text(json.dumps(config, indent=4))


@contextmanager
def genai_engine(
    model_dir: Path, prompt: list[int], n_new: int, threads: int
) -> Iterator[Callable[[], Run]]:
    import onnxruntime_genai as og

    set_genai_threads(model_dir, threads)
    model = og.Model(str(model_dir))
    total = len(prompt) + n_new
    ids = np.asarray([prompt], dtype=np.int32)

    def once() -> Run:
        params = og.GeneratorParams(model)
        # min_length = max_length: exactly N new tokens, EOS cannot end the run early.
        params.set_search_options(do_sample=False, max_length=total, min_length=total)
        generator = og.Generator(model, params)
        start = time.perf_counter()
        generator.append_tokens(ids)  # the prompt pass
        generator.generate_next_token()  # picks token 1 from the prompt's logits
        first = time.perf_counter()
        for _ in range(n_new - 1):
            generator.generate_next_token()  # one-token pass + pick
        end = time.perf_counter()
        tokens = [int(t) for t in generator.get_sequence(0)[len(prompt) :]]
        del generator
        return Run(
            prefill_s=first - start,
            decode_s=end - first,
            prompt_tokens=len(prompt),
            decode_tokens=n_new - 1,
            tokens=tokens,
        )

    yield once  # the model is freed with this generator's frame; run_engine then collects


def genai_worker(spec_path: str) -> None:
    """Subprocess entry (--genai-worker SPEC): measure genai, write runs as JSON."""
    spec = json.loads(Path(spec_path).read_text())
    with genai_engine(Path(spec["model_dir"]), spec["prompt"], spec["n_new"], spec["threads"]) as f:
        runs = measure(f, spec["warmup"], spec["repeats"], spec["quiet_wait"], spec["retries"])
    Path(spec["out"]).write_text(
        json.dumps({"runs": [asdict(r) for r in runs], "info": genai_info()})
    )


def genai_in_subprocess(
    python: str, model_dir: Path, prompt: list[int], args: argparse.Namespace
) -> list[Run]:
    cmd = [python, str(Path(__file__).resolve()), "--genai-worker"]
    answer = worker_answer(cmd, {"model_dir": str(model_dir)}, prompt, args, "genai")
    GENAI_INFO.update(answer["info"], python=python)
    return [Run(**r) for r in answer["runs"]]


GENAI_INFO: dict[str, str] = {}  # versions seen by whichever interpreter ran genai
LLAMACPP_INFO: dict[str, str] = {}  # the llama.cpp build's version line


def genai_info() -> dict[str, str]:
    import onnxruntime
    import onnxruntime_genai

    return {
        "onnxruntime-genai": onnxruntime_genai.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def genai_in_process() -> bool:
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        return False
    return True


def edgespec_importable() -> str | None:
    """None if edgespec (runtime and export) imports, else why not."""
    try:
        import edgespec  # noqa: F401
        from edgespec.export import export_bundle  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any failure means "not usable yet"
        return f"{type(e).__name__}: {e}"
    return None


# --------------------------------------------------------------------------- one shape
def bench_shape(shape: str, args: argparse.Namespace) -> dict[str, Any]:
    cache: Path = args.cache
    seed: int = args.seed
    rebuild = set(args.rebuild)
    log(f"[{shape}] checkpoint")
    folder = build_checkpoint(shape, seed, cache, "checkpoint" in rebuild)
    params, read_bytes = weight_bytes_per_token(folder)
    prompt = prompt_ids(seed, args.prompt_len)
    n_new: int = args.new_tokens
    results: dict[str, EngineResult] = {}

    jobs = [
        (engine, precision)
        for precision in args.precisions
        for engine in ("transformers", "edgespec", "genai", "llamacpp")
        if engine in args.engines
        and (
            precision == "fp32"
            or engine == "edgespec"
            or (engine, block_of(precision)) == ("llamacpp", None)
        )
    ]
    # --rounds R runs the whole job list R times (the engines take turns), so a slow spell
    # of the shared machine hits every engine of a round alike; a row is its median over
    # every round's runs, and its per-round decode rates say how far they scattered.
    runs_of: dict[str, list[Run]] = {}
    for round_no in range(args.rounds):
        for engine, precision in jobs:
            key = f"{engine} {precision}"
            result = results.setdefault(key, EngineResult(engine, precision))
            if result.status != "ok":
                continue
            start = time.perf_counter()
            try:
                runs = run_engine(engine, precision, folder, prompt, args, rebuild)
            except EngineSkipped as e:
                result.status, result.message = "skipped", str(e)
                log(f"[{shape}] {key}: skipped: {e}")
                continue
            except Exception as e:  # noqa: BLE001 - report the row, keep benchmarking
                result.status, result.message = "error", f"{type(e).__name__}: {e}"
                log(f"[{shape}] {key}: error\n{traceback.format_exc()}")
                continue
            rebuild.discard(engine)  # re-exported / re-converted once, not every round
            result.elapsed_s += time.perf_counter() - start
            runs_of.setdefault(key, []).extend(runs)
            result.round_decode_tps.append(statistics.median(r.decode_tps for r in counted(runs)))
            summarize(result, runs_of[key], args.stat, n_new)
            log(
                f"[{shape}] {key} (round {round_no + 1}/{args.rounds}): prefill "
                f"{result.prefill_tps:.1f} tok/s, decode {result.decode_tps:.2f} tok/s"
            )

    compare_tokens(results)
    return {
        "shape": shape,
        "title": SHAPE_TITLES[shape],
        "config": SHAPES[shape][1],
        "checkpoint": str(folder),
        "parameters": params,
        "weight_bytes_per_token": read_bytes,
        "weights_read_per_token": read_bytes // 4,  # the checkpoint is fp32
        "bound_decode_tps": {},  # precision -> tok/s, set once the bandwidth is known
        "prompt": prompt,
        "engines": [asdict(r) for r in results.values()],
    }


def compare_tokens(results: dict[str, EngineResult]) -> None:
    """Greedy tokens: llama.cpp against edgespec at the same precision, the other fp32 rows
    against transformers."""
    hf = results.get("transformers fp32")
    for r in results.values():
        if r.status != "ok":
            continue
        peer = results.get(f"edgespec {r.precision}")  # llama.cpp rows are base precisions
        if r.engine == "llamacpp" and peer is not None and peer.status == "ok":
            r.same_tokens, r.same_as = leading_match(r.tokens, peer.tokens), "edgespec"
        elif hf is not None and hf.status == "ok" and r.precision == "fp32" and r is not hf:
            r.same_tokens, r.same_as = leading_match(r.tokens, hf.tokens), "transformers"


class EngineSkipped(Exception):
    """The engine cannot run here (not installed / not importable yet)."""


def run_engine(
    engine: str,
    precision: str,
    folder: Path,
    prompt: list[int],
    args: argparse.Namespace,
    rebuild: set[str],
) -> list[Run]:
    n_new, threads = args.new_tokens, args.threads
    if engine == "transformers":
        try:
            with transformers_engine(folder, prompt, n_new, threads) as once:
                return measure(once, args.warmup, args.repeats, args.quiet_wait, args.retries)
        finally:
            gc.collect()
    if engine == "edgespec":
        why = edgespec_importable()
        if why is not None:
            raise EngineSkipped(f"edgespec not importable yet ({why})")
        bundle = folder.parent / f"edgespec-{precision}"
        stamp = bundle / ".complete"
        exporter = edgespec_exporter_digest()
        stale = not stamp.exists() or stamp.read_text() != exporter
        fresh = stale or "edgespec" in rebuild
        if fresh:
            log(
                "  exporting the edgespec bundle"
                + (" (exporter changed)" if stamp.exists() else "")
            )
            export_edgespec(folder, bundle, precision)
            stamp.write_text(exporter)
        try:
            model = load_edgespec(bundle, threads)
        except Exception:
            if fresh:
                raise
            log("  the cached edgespec bundle does not load; re-exporting it")
            export_edgespec(folder, bundle, precision)
            stamp.write_text(exporter)
            model = load_edgespec(bundle, threads)
        try:
            return measure(
                edgespec_runner(model, prompt, n_new),
                args.warmup,
                args.repeats,
                args.quiet_wait,
                args.retries,
            )
        finally:
            del model
            gc.collect()
    if engine == "llamacpp":
        from llamacpp_engine import LlamaCppEnv, gguf_for, llamacpp_runs

        try:
            env = LlamaCppEnv.from_venv(args.llamacpp_venv)
        except FileNotFoundError as e:
            raise EngineSkipped(str(e)) from None
        gguf = gguf_for(folder, precision, env, rebuild="llamacpp" in rebuild)
        LLAMACPP_INFO.setdefault("version", env.version())
        return llamacpp_runs(env, gguf, prompt, args)
    # genai
    python = args.genai_python or (sys.executable if genai_in_process() else None)
    if python is None:
        raise EngineSkipped(
            "onnxruntime_genai is not importable here; install it (plus onnx-ir for its "
            "builder) or pass --genai-python PYTHON of a venv that has it"
        )
    out = folder.parent / "genai-fp32"
    if not (out / ".complete").exists() or "genai" in rebuild:
        log("  exporting with the genai model builder")
        export_genai(folder, out, python)
        (out / ".complete").write_text("ok")
    if args.genai_python:
        return genai_in_subprocess(args.genai_python, out, prompt, args)
    GENAI_INFO.update(genai_info(), python=sys.executable)
    try:
        with genai_engine(out, prompt, n_new, threads) as once:
            return measure(once, args.warmup, args.repeats, args.quiet_wait, args.retries)
    finally:
        gc.collect()


# --------------------------------------------------------------------------- report
def format_table(shape: dict[str, Any], n_new: int) -> str:
    """One row per (engine, precision); ratios against transformers / genai (fp32) and against
    llama.cpp at the row's precision; % of that precision's bandwidth bound."""
    rows = {f"{r['engine']} {r['precision']}": r for r in shape["engines"]}

    def tps(key: str) -> float:
        r = rows.get(key)
        return r["decode_tps"] if r and r["status"] == "ok" else 0.0

    head = (
        f"{'engine':<22}{'prefill tok/s':>14}{'decode tok/s':>14}{'x HF':>7}{'x genai':>9}"
        f"{'x llama.cpp':>12}{'% bound':>9}{'same tokens':>24}  note"
    )
    lines = [
        f"{shape['title']} ({shape['parameters'] / 1e6:.1f}M params, "
        f"{shape['weights_read_per_token'] / 1e6:.0f}M weights read per token)",
        head,
        "-" * len(head),
    ]
    from llamacpp_engine import PRECISIONS as GGUF

    for r in rows.values():
        name = f"{'llama.cpp' if r['engine'] == 'llamacpp' else r['engine']} "
        name += GGUF[r["precision"]][0] if r["engine"] == "llamacpp" else r["precision"]
        if r["status"] != "ok":
            lines.append(f"{name:<22}{'-':>14}{'-':>14}  {r['status']}: {r['message'][:160]}")
            continue
        d, bound = r["decode_tps"], shape["bound_decode_tps"][base_precision(r["precision"])]
        base_hf, base_genai = tps("transformers fp32"), tps("genai fp32")
        base_llama = tps(f"llamacpp {base_precision(r['precision'])}")
        x_hf = f"{d / base_hf:.2f}" if base_hf and r["precision"] == "fp32" else "-"
        x_genai = f"{d / base_genai:.2f}" if base_genai and r["precision"] == "fp32" else "-"
        x_llama = f"{d / base_llama:.2f}" if base_llama else "-"
        same = f"{r['same_tokens']}/{n_new} vs {r['same_as']}" if r["same_as"] else "n/a"
        note = r["message"]
        rounds = r.get("round_decode_tps", [])
        if len(rounds) > 1:  # each round's rate, and its ratio to the same round's llama.cpp
            note = f"rounds {'/'.join(f'{x:.1f}' for x in rounds)} " + note
            peer = rows.get(f"llamacpp {base_precision(r['precision'])}")
            if r["engine"] != "llamacpp" and peer and len(peer["round_decode_tps"]) == len(rounds):
                ratios = (a / b for a, b in zip(rounds, peer["round_decode_tps"], strict=True))
                note += f"(x llama.cpp {'/'.join(f'{x:.2f}' for x in ratios)}) "
        lines.append(
            f"{name:<22}{r['prefill_tps']:>14.1f}{d:>14.2f}{x_hf:>7}{x_genai:>9}{x_llama:>12}"
            f"{100 * d / bound:>8.0f}%{same:>24}  {note}"
        )
    for precision, bound in shape["bound_decode_tps"].items():
        lines.append(
            f"{'bound ' + precision:<22}{'':>14}{bound:>14.2f}{'':>28}{'100%':>9}{'':>24}  "
            f"weights read per token x {BYTES_PER_WEIGHT[precision]:.3g} B / bandwidth"
        )
    return "\n".join(lines)


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("numpy", "torch", "transformers", "onnxruntime", "onnxruntime-genai", "edgespec"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "-"
    if out["edgespec"] == "-" and edgespec_importable() is None:  # a checkout on sys.path
        import edgespec

        out["edgespec"] = f"{edgespec.__version__} (source checkout)"
    return out


def git_state() -> str:
    """The checkout's commit, "+dirty" when edgespec/ has uncommitted changes."""

    def git(*argv: str) -> str:
        proc = subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, timeout=10)
        return proc.stdout.strip()

    try:
        head, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "edgespec")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class CpuMonitor:
    """CPU time the rest of the machine used since construction (ours and our children's
    excluded), from /proc/stat; steal time counts as used by others."""

    def __init__(self) -> None:
        self.wall, self.busy, self.own = time.perf_counter(), self._busy(), self._own()

    @staticmethod
    def _busy() -> float:
        try:
            fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        except OSError:
            return float("nan")
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def other_cores(self) -> float:
        wall = time.perf_counter() - self.wall
        other = (self._busy() - self.busy) - (self._own() - self.own)
        return max(0.0, other / wall) if wall > 0 else 0.0


def wait_for_quiet(max_wait: float) -> float:
    """Wait (up to `max_wait` s) for a 1 s window in which other processes use less than
    QUIET_CORES cores; return the seconds waited. 2 shared cores make this matter."""
    start = time.perf_counter()
    while time.perf_counter() - start < max_wait:
        monitor = CpuMonitor()
        time.sleep(1.0)
        if monitor.other_cores() < QUIET_CORES:
            break
    return time.perf_counter() - start


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma list of: " + ", ".join(SHAPES))
    p.add_argument(
        "--engines", default=",".join(ENGINES), help="comma list of: " + ", ".join(ENGINES)
    )
    p.add_argument(
        "--precisions",
        default="fp32",
        help="comma list of: " + ", ".join(PRECISIONS) + " (edgespec and llama.cpp rows; "
        "transformers and genai run fp32 only); int8@32 / int4@32: edgespec with that block "
        "instead of the export's default (no extra llama.cpp row)",
    )
    p.add_argument(
        "--llamacpp-venv",
        type=Path,
        default=Path("/work/venv-llamacpp"),
        help="venv made by benchmarks/setup_llamacpp.sh (llama.cpp built from source there)",
    )
    p.add_argument("--threads", type=int, default=2, help="intra-op threads for every engine")
    p.add_argument("--new-tokens", type=int, default=64, help="N new tokens per generation")
    p.add_argument("--prompt-len", type=int, default=64, help="prompt length in tokens")
    p.add_argument("--warmup", type=int, default=1, help="untimed generations first")
    p.add_argument("--repeats", type=int, default=3, help="timed generations")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every engine and precision this many times, in turns (a row: the median "
        "over all rounds' runs; its per-round rates show the machine's noise)",
    )
    p.add_argument("--stat", choices=("median", "best"), default="median")
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=30.0,
        help="before each timed run wait up to this many seconds for other processes to "
        "leave the CPU idle (0: never wait)",
    )
    p.add_argument(
        "--retries",
        type=int,
        default=None,
        help="extra timed runs allowed to replace runs other processes disturbed "
        "(default: as many as --repeats)",
    )
    p.add_argument("--seed", type=int, default=0, help="torch seed for weights; numpy for prompt")
    p.add_argument(
        "--cache",
        type=Path,
        default=BENCH_CACHE,
        help="where checkpoints and exported models are kept (default ~/.cache/edgespec-bench)",
    )
    p.add_argument(
        "--rebuild",
        default="",
        help="comma list of cached artifacts to rebuild: checkpoint, edgespec, genai",
    )
    p.add_argument(
        "--genai-python",
        default=None,
        help="interpreter of a venv with onnxruntime-genai (+ onnx-ir, torch, transformers); "
        "genai is then exported and measured in a subprocess of it",
    )
    p.add_argument("--bw-bytes", type=int, default=1 << 30, help="buffer size for the copy test")
    p.add_argument("--json", type=Path, default=None, help="also write all results here")
    p.add_argument("--genai-worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.genai_worker:
        return args
    args.cache = args.cache.expanduser()
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.engines = [e for e in args.engines.split(",") if e]
    args.rebuild = [r for r in args.rebuild.split(",") if r]
    args.precisions = [x for x in args.precisions.split(",") if x]
    for x in args.precisions:
        base, at = base_precision(x), x.partition("@")[2]
        if base not in PRECISIONS or (at and (base not in ("int8", "int4") or not at.isdigit())):
            p.error(
                f"unknown precision {x!r}; choose from {', '.join(PRECISIONS)} "
                "(int8/int4 take a block: int4@32)"
            )
    for s in args.shapes:
        if s not in SHAPES:
            p.error(f"unknown shape {s!r}; choose from {', '.join(SHAPES)}")
    for e in args.engines:
        if e not in ENGINES:
            p.error(f"unknown engine {e!r}; choose from {', '.join(ENGINES)}")
    for r in args.rebuild:
        if r not in ("checkpoint", "edgespec", "genai", "llamacpp"):
            p.error(
                f"unknown --rebuild item {r!r}; choose from checkpoint, edgespec, genai, llamacpp"
            )
    if args.new_tokens < 2:
        p.error("--new-tokens must be at least 2 (one prefill token + decode)")
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.retries is None:
        args.retries = args.repeats
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.genai_worker:
        genai_worker(args.genai_worker)
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may touch the network
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    args.cache.mkdir(parents=True, exist_ok=True)
    load_start = loadavg()
    if load_start > 0.5:
        log(f"warning: load average is {load_start:.2f} before starting; numbers will be noisy")

    def bandwidth_now() -> dict[str, float]:
        log("measuring memory bandwidth")
        wait_for_quiet(args.quiet_wait)
        return memory_bandwidth(args.bw_bytes, args.threads)

    samples = [bandwidth_now()]
    meta: dict[str, Any] = {
        "threads": args.threads,
        "new_tokens": args.new_tokens,
        "prompt_len": args.prompt_len,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "stat": args.stat,
        "quiet_wait": args.quiet_wait,
        "retries": args.retries,
        "seed": args.seed,
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "versions": versions(),
        "edgespec_git": git_state(),
        "genai": GENAI_INFO,
        "llamacpp": LLAMACPP_INFO,
        "precisions": args.precisions,
        "genai_mode": (
            f"subprocess: {args.genai_python}"
            if args.genai_python
            else ("in-process" if genai_in_process() else "unavailable")
        ),
    }
    shapes = [bench_shape(s, args) for s in args.shapes]
    meta["load_average_start_end"] = [load_start, loadavg()]
    # Measured before and after the engines; the bound takes the best (other jobs only lower it).
    samples.append(bandwidth_now())
    bw = {key: max(b[key] for b in samples) for key in samples[0]}
    meta["bandwidth_samples_bytes_per_s"] = samples
    meta["copy_bandwidth_bytes_per_s"] = bw["copy"]  # read + write
    meta["read_bandwidth_bytes_per_s"] = bw["read"]
    meta["bound_bandwidth_bytes_per_s"] = bw["bound"]
    for shape in shapes:
        shape["bound_decode_tps"] = {
            p: bw["bound"] / (shape["weights_read_per_token"] * BYTES_PER_WEIGHT[p])
            for p in dict.fromkeys(map(base_precision, args.precisions))
        }
    print(
        f"\ngreedy CPU ({', '.join(args.precisions)}), {args.threads} threads, "
        f"prompt {args.prompt_len} tokens, "
        f"{args.new_tokens} new tokens, {args.stat} of {args.repeats} (+{args.warmup} warm-up); "
        f"memory bandwidth ({args.threads} threads): copy {bw['copy'] / 1e9:.1f} GB/s "
        f"(read+write), read {bw['read'] / 1e9:.1f} GB/s; {meta['cpu']}; "
        f"load average {load_start:.2f} at start, {meta['load_average_start_end'][1]:.2f} at end"
    )
    for shape in shapes:
        print()
        print(format_table(shape, args.new_tokens))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": meta, "shapes": shapes}, indent=2))
        print(f"\nwrote {args.json}")
        from plots import try_plot

        try_plot("ar", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
