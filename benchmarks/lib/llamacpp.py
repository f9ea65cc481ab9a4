"""llama.cpp as a peer engine: GGUF conversion, quantization and timed greedy runs.

Takes a local Hugging Face checkpoint folder and the llama.cpp build of `setup_llamacpp.sh`
(its venv's interpreter, `build/bin` with libllama.so and llama-quantize, and the llama.cpp
tree with `convert_hf_to_gguf.py`). Guarantees:

* `gguf_for(folder, precision, env)`: a cached GGUF beside the checkpoint — F32 / F16 straight
  from `convert_hf_to_gguf.py`, Q8_0 / Q4_0 from the F32 one by `llama-quantize --pure` (every
  weight matrix in the named type, the tied embedding / LM head too). The converter's BPE
  pre-tokenizer check does not know the benchmarks' stdlib-trained tokenizer; it is told
  "gpt-2", which is what that tokenizer's byte-level pre-tokenizer is (prompt ids, not text,
  are what the runs feed).
* `llamacpp_runs(env, gguf, prompt, args)`: a worker in the llama.cpp venv
  (`python -m benchmarks.lib.llamacpp --worker SPEC`) loads the model through the `llama_cpp`
  bindings (n_threads = n_threads_batch = T) and times each greedy generation as the genai
  engine is timed: `eval(prompt)` + the argmax of its last logits is the prefill, then N - 1
  one-token `eval`s + argmax are the decode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.lib.timing import Run, measure

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
folder, out, outtype = sys.argv[1:4]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
import convert_hf_to_gguf as convert
sys.argv = ["convert_hf_to_gguf.py", folder, "--outfile", out, "--outtype", outtype]
convert.main()
"""  # in the llama.cpp venv, the tree and its gguf-py on PYTHONPATH


@dataclass(frozen=True)
class LlamaCppEnv:
    """Where setup_llamacpp.sh put things."""

    python: str  # the llama.cpp venv's interpreter (torch, gguf, llama_cpp bindings)
    bin: Path  # build/bin: libllama.so, llama-quantize, llama-bench, ...
    tree: Path  # the llama.cpp source tree (convert_hf_to_gguf.py)

    @classmethod
    def from_venv(cls, venv: Path) -> LlamaCppEnv:
        """Read `$VENV/llamacpp.env` as setup_llamacpp.sh writes it."""
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
        raise RuntimeError(
            f"{what} failed ({' '.join(cmd)}):\n{(proc.stdout + proc.stderr)[-3000:]}"
        )


def gguf_for(folder: Path, precision: str, env: LlamaCppEnv, rebuild: bool = False) -> Path:
    """The checkpoint as a GGUF of `precision` (cached in folder's parent)."""
    from benchmarks.lib.models import outdated

    ftype, outtype = PRECISIONS[precision]
    out = folder.parent / f"{folder.name}-llamacpp-{ftype}.gguf"
    if not rebuild and not outdated(out, folder):
        return out
    tmp = out.with_suffix(".tmp")
    if outtype is not None:
        cmd = [env.python, "-c", CONVERT, str(folder), str(tmp), outtype]
        paths = os.pathsep.join([str(env.tree), str(env.tree / "gguf-py")])
        _run(cmd, dict(env.subprocess_env(), PYTHONPATH=paths), "convert_hf_to_gguf.py")
    else:
        source = gguf_for(folder, "fp32", env)
        cmd = [str(env.bin / "llama-quantize"), "--pure", str(source), str(tmp), ftype, "2"]
        _run(cmd, env.subprocess_env(), "llama-quantize")
    tmp.replace(out)
    return out


def llamacpp_runs(env: LlamaCppEnv, gguf: Path, prompt: list[int], args: Any) -> list[Run]:
    """Timed greedy generations of `gguf` in a worker of the llama.cpp venv."""
    from benchmarks.lib.engines import worker_answer

    cmd = [env.python, "-m", "benchmarks.lib.llamacpp", "--worker"]
    answer = worker_answer(
        cmd, {"gguf": str(gguf)}, prompt, args, "llama.cpp", env.subprocess_env()
    )
    return [Run(**r) for r in answer["runs"]]


def _worker(spec_path: str) -> None:
    """In the llama.cpp venv: load the GGUF, measure greedy runs, write them as JSON."""
    import time

    import llama_cpp
    import numpy as np

    spec = json.loads(Path(spec_path).read_text())
    prompt, n_new, threads = spec["prompt"], spec["new_tokens"], spec["threads"]
    llm = llama_cpp.Llama(model_path=spec["gguf"], n_ctx=len(prompt) + n_new + 16,
                          n_batch=max(len(prompt), 8), n_ubatch=max(len(prompt), 8),
                          n_threads=threads, n_threads_batch=threads, logits_all=False,
                          verbose=False)  # fmt: skip
    n_vocab = llm.n_vocab()

    def argmax_last() -> int:
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))

    def once() -> Run:
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt)  # the prompt pass
        tokens = [argmax_last()]
        first, cpu = time.perf_counter(), time.process_time()
        for _ in range(n_new - 1):
            llm.eval([tokens[-1]])
            tokens.append(argmax_last())
        end = time.perf_counter()
        run = Run(first - start, end - first, len(prompt), n_new - 1, tokens)
        run.decode_cpu_s = time.process_time() - cpu
        return run

    runs = measure(once, spec["warmup"], spec["repeats"], spec["quiet_wait"], spec["retries"])
    Path(spec["out"]).write_text(json.dumps({"runs": [asdict(r) for r in runs]}))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker(sys.argv[2])
    else:
        sys.exit("usage: python -m benchmarks.lib.llamacpp --worker SPEC")
