"""llama.cpp as a peer engine for bench_ar.py: GGUF conversion, quantization and timed greedy runs.

Takes a local Hugging Face checkpoint folder and the llama.cpp build of `setup_llamacpp.sh` (its
venv's interpreter, the `build/bin` folder with libllama.so and llama-quantize, and the vendored
llama.cpp tree with `convert_hf_to_gguf.py`). Guarantees:

* `gguf_for(folder, precision, env)`: a cached GGUF next to the checkpoint — F32 / F16 straight from
  `convert_hf_to_gguf.py`, Q8_0 / Q4_0 from the F32 one by `llama-quantize --pure` (every weight
  matrix in the named type, the tied embedding / LM head too, as edgespec's int8/int4 export does
  with its block-32 MatMulNBits weights). The converter's BPE pre-tokenizer check does not know the
  benchmark's own stdlib-trained tokenizer; it is told "gpt-2", which is what that tokenizer's
  byte-level pre-tokenizer is (the GPT-2 regex), so prompt ids, not text, are what the runs feed.
* `SpeculativeRunner`: one greedy generation per call for bench_auto.py, end to end (prompt pass
  + every new token, model loading excluded): "plain" through the bindings (prompt ids in,
  token ids out), and llama.cpp's own speculative decoding through its
  `llama-speculative-simple` example (the `common/speculative` drafters the server uses too):
  `draft-simple` with a draft GGUF (its defaults: up to 16 drafts, stop below p 0.75) and the
  n-gram types `ngram-simple`, `ngram-map-k`, `ngram-mod`, fed the prompt as text (the CLI has
  no ids option) and timed by its own `encoded` + `decoded` lines; its output text comes back
  for the "same as ar" check, and its drafted / accepted counts.
* `llamacpp_runs(gguf, prompt, n_new, threads, ...)`: a worker subprocess in the llama.cpp venv
  loads the model through the `llama_cpp` ctypes bindings (n_threads = n_threads_batch = T) and
  times each greedy generation exactly like bench_ar's genai engine: `eval(prompt)` + the argmax
  of its last logits is the prefill, then N - 1 single-token `eval`s + argmax are the decode. The
  runs come back as bench_ar `Run`s (with the same quiet-machine wait and warm-up).

Run as a script only as that worker (`python llamacpp_engine.py --worker SPEC`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common import outdated, worker_answer

# precision name (edgespec's) -> (GGUF file type, convert outtype or None when quantized from F32)
PRECISIONS: dict[str, tuple[str, str | None]] = {
    "fp32": ("F32", "f32"),
    "fp16": ("F16", "f16"),
    "int8": ("Q8_0", None),
    "int4": ("Q4_0", None),
}
# Bytes per weight read at decode: fp32 / fp16, and GGUF's block-32 layouts (Q8_0: 32 int8 + an
# fp16 scale = 34 bytes per 32 weights; Q4_0: 16 bytes of nibbles + an fp16 scale = 18 bytes).
BYTES_PER_WEIGHT = {"fp32": 4.0, "fp16": 2.0, "int8": 34 / 32, "int4": 18 / 32}

CONVERT = """
import sys
tree, folder, out, outtype = sys.argv[1:5]
sys.path.insert(0, tree)
sys.path.insert(1, tree + "/gguf-py")
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
import convert_hf_to_gguf as convert
sys.argv = ["convert_hf_to_gguf.py", folder, "--outfile", out, "--outtype", outtype]
convert.main()
"""


@dataclass(frozen=True)
class LlamaCppEnv:
    """Where setup_llamacpp.sh put things."""

    python: str  # the llama.cpp venv's interpreter (torch, gguf, llama_cpp bindings)
    bin: Path  # build/bin: libllama.so, llama-quantize, llama-bench, llama-speculative, ...
    tree: Path  # the vendored llama.cpp source tree (convert_hf_to_gguf.py)

    @classmethod
    def from_venv(cls, venv: Path) -> LlamaCppEnv:
        """Read `$VENV/llamacpp.env` as setup_llamacpp.sh writes it; clear error if missing."""
        env_file = venv / "llamacpp.env"
        if not env_file.exists():
            raise FileNotFoundError(
                f"{env_file} not found: build llama.cpp first with "
                f"`VENV={venv} bash benchmarks/setup_llamacpp.sh`"
            )
        values = {}
        for line in env_file.read_text().splitlines():
            if line.startswith("export ") and "=" in line:
                key, value = line[len("export ") :].split("=", 1)
                values[key] = value
        return cls(str(venv / "bin" / "python"), Path(values["LLAMACPP_BIN"]),
                   Path(values["LLAMACPP_TREE"]))  # fmt: skip

    def subprocess_env(self) -> dict[str, str]:
        return dict(os.environ, LLAMA_CPP_LIB_PATH=str(self.bin), HF_HUB_OFFLINE="1")

    def version(self) -> str:
        proc = subprocess.run([str(self.bin / "llama-bench"), "--version"],
                              capture_output=True, text=True)  # fmt: skip
        text = (proc.stdout + proc.stderr).strip().splitlines()
        return next((line for line in text if "version" in line), "unknown")


def _run(cmd: list[str], env: dict[str, str], what: str) -> None:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RuntimeError(f"{what} failed ({' '.join(cmd)}):\n{tail}")


def gguf_for(folder: Path, precision: str, env: LlamaCppEnv, rebuild: bool = False) -> Path:
    """The checkpoint as a GGUF of `precision` (cached in folder's parent)."""
    ftype, outtype = PRECISIONS[precision]
    out = folder.parent / f"{folder.name}-llamacpp-{ftype}.gguf"
    if not rebuild and not outdated(out, folder):
        return out
    tmp = out.with_suffix(".tmp")
    if outtype is not None:
        cmd = [env.python, "-c", CONVERT, str(env.tree), str(folder), str(tmp), outtype]
        _run(cmd, env.subprocess_env(), "convert_hf_to_gguf.py")
    else:
        source = gguf_for(folder, "fp32", env)
        cmd = [str(env.bin / "llama-quantize"), "--pure", str(source), str(tmp), ftype, "2"]
        _run(cmd, env.subprocess_env(), "llama-quantize")
    tmp.replace(out)
    return out


def llamacpp_runs(env: LlamaCppEnv, gguf: Path, prompt: list[int], args: Any) -> list[Any]:
    """Timed greedy generations of `gguf` in a worker subprocess (see the module docstring)."""
    from bench_ar import Run

    cmd = [env.python, str(Path(__file__).resolve()), "--worker"]
    model = {"gguf": str(gguf)}
    answer = worker_answer(cmd, model, prompt, args, "llama.cpp", env.subprocess_env())
    return [Run(**r) for r in answer["runs"]]


SPEC_TYPES = {  # bench_auto row label -> llama-speculative-simple options
    "draft": ["--spec-type", "draft-simple"],
    "ngram-simple": ["--spec-type", "ngram-simple"],
    "ngram-map-k": ["--spec-type", "ngram-map-k"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
}


@dataclass
class SpecSample:
    seconds: float  # prompt pass + decode, as the tool measures them
    n_tokens: int
    text: str | None  # the generated text (CLI rows) or None (plain: ids)
    tokens: list[int]  # plain: the ids; CLI rows: empty
    drafted: int = 0
    accepted: int = 0


class SpeculativeRunner:
    """llama.cpp plain / speculative generations of a target (and draft) GGUF pair."""

    def __init__(self, env: LlamaCppEnv, target: Path, draft: Path, threads: int) -> None:
        self.env, self.target, self.draft, self.threads = env, target, draft, threads

    def run(self, config: str, ids: list[int], text: str, n_new: int) -> SpecSample:
        if config == "plain":
            ns = type("Args", (), dict(new_tokens=n_new, threads=self.threads, warmup=0,
                                       repeats=1, quiet_wait=0.0, retries=0))  # fmt: skip
            run = llamacpp_runs(self.env, self.target, ids, ns)[0]
            return SpecSample(run.prefill_s + run.decode_s, len(run.tokens), None, run.tokens)
        t = str(self.threads)
        cmd = [
            str(self.env.bin / "llama-speculative-simple"), "-m", str(self.target),
            "-p", text, "-n", str(n_new), "--ignore-eos", "--temp", "0", "--top-k", "1",
            "-t", t, "-tb", t, "-c", "1024", "--seed", "0",
            *SPEC_TYPES[config],
        ]  # fmt: skip
        if config == "draft":
            cmd += ["-md", str(self.draft), "-td", t, "-tbd", t]
        # Its summary lines go through common/log's worker thread, which now and then loses
        # them at exit on a busy machine (rc 0, no "decoded" line): run again, up to 3 times.
        for _ in range(3):
            proc = subprocess.run(cmd, env=self.env.subprocess_env(), capture_output=True,
                                  text=True)  # fmt: skip
            log = proc.stdout + proc.stderr
            found = {k: re.search(pattern, log) for k, pattern in PARSE.items()}
            if proc.returncode == 0 and all(found.values()):
                break
        else:
            raise RuntimeError(f"{' '.join(cmd[:3])} ... failed:\n{log[-2000:]}")
        seconds = float(found["enc"][1]) + float(found["dec"][2])
        out = proc.stdout
        return SpecSample(seconds, int(found["dec"][1]), out, [],
                          int(found["drafted"][1]), int(found["accept"][1]))  # fmt: skip


PARSE = {
    "enc": r"encoded\s+\d+ tokens in\s+([\d.]+) seconds",
    "dec": r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds",
    "drafted": r"n_drafted\s*=\s*(\d+)",
    "accept": r"n_accept\s*=\s*(\d+)",
}


def worker(spec_path: str) -> None:
    """In the llama.cpp venv: load the GGUF, measure greedy runs, write them as JSON."""
    import time

    import llama_cpp
    import numpy as np
    from bench_ar import Run, measure

    spec = json.loads(Path(spec_path).read_text())
    prompt, n_new, threads = spec["prompt"], spec["n_new"], spec["threads"]
    llm = llama_cpp.Llama(
        model_path=spec["gguf"],
        n_ctx=len(prompt) + n_new + 16,
        n_batch=max(len(prompt), 8),
        n_ubatch=max(len(prompt), 8),
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=False,
        verbose=False,
    )
    n_vocab = llm.n_vocab()

    def argmax_last() -> int:
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))

    def once() -> Run:
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt)  # the prompt pass
        tokens = [argmax_last()]
        first = time.perf_counter()
        for _ in range(n_new - 1):
            llm.eval([tokens[-1]])  # one-token pass
            tokens.append(argmax_last())
        end = time.perf_counter()
        return Run(first - start, end - first, len(prompt), n_new - 1, tokens)

    runs = measure(once, spec["warmup"], spec["repeats"], spec["quiet_wait"], spec["retries"])
    Path(spec["out"]).write_text(json.dumps({"runs": [asdict(r) for r in runs]}))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        sys.exit("usage: llamacpp_engine.py --worker SPEC (bench_ar.py runs this itself)")
