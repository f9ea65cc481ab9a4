"""The engines a scenario times, each behind one shape: a context manager (or function) that
yields `once() -> Run`, one greedy generation of exactly `n_new` tokens after `prompt` ids.

* edgespec: `edgespec_runner(model, ...)` times by the model's own stats (`prefill_seconds`
  covers the prompt pass and token 1, `decode_seconds` the rest); `stream_sample` times one
  streamed generation end to end and counts its rounds (the speculative scenarios).
* transformers: `generate(do_sample=False)` with a streamer that timestamps every `put` (the
  prompt, token 1, ..., token N): prefill = token 1 - prompt, decode = token N - token 1.
* onnxruntime-genai: `append_tokens(prompt)` + the first `generate_next_token()` are the
  prefill, the other N - 1 calls the decode; in this interpreter, or in a worker of another
  (`--genai-python`): `python -m benchmarks.lib.engines --genai-worker SPEC`.
* llama.cpp: `benchmarks.lib.llamacpp` (its own venv, a worker the same way).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.lib.machine import REPO
from benchmarks.lib.timing import Run, measure

ENGINES = ("edgespec", "transformers", "genai", "llamacpp")


class EngineSkipped(Exception):
    """The engine cannot run here (not installed); the row says why."""


# --------------------------------------------------------------------------- edgespec
def edgespec_runner(model: Any, prompt: list[int], n_new: int) -> Callable[[], Run]:
    def once() -> Run:
        tokens: list[int] = []
        start = time.perf_counter()
        prefill_s = cpu = 0.0
        decode_tokens = -1  # the prefill's token is not a decode token
        for chunk in model.stream(list(prompt), max_new_tokens=n_new, ignore_eos=True):
            tokens += [int(t) for t in chunk.tokens]
            decode_tokens += len(chunk.tokens)
            if chunk.stats.phase == "prefill":
                prefill_s, cpu = time.perf_counter() - start, time.process_time()
        decode_s = time.perf_counter() - start - prefill_s
        run = Run(prefill_s, decode_s, len(prompt), decode_tokens, tokens)
        run.decode_cpu_s = time.process_time() - cpu
        return run

    return once


@dataclass
class Sample:
    """One streamed generation, end to end (prefill included)."""

    seconds: float
    tokens: list[int]
    gammas: Counter = field(default_factory=Counter)  # drafted tokens per round
    drafted: int = 0
    accepted: int = 0
    decode_seconds: float = 0.0  # from the prefill's token to the last

    @property
    def n(self) -> int:
        return len(self.tokens)


def stream_sample(model: Any, ids: list[int], n_new: int, temperature: float = 0.0,
                  seed: int | None = None) -> Sample:  # fmt: skip
    """Time one `model.stream` generation of exactly `n_new` tokens."""
    sample = Sample(0.0, [])
    start = prefilled = time.perf_counter()
    for chunk in model.stream(
        ids, max_new_tokens=n_new, temperature=temperature, seed=seed, ignore_eos=True
    ):
        sample.tokens += chunk.tokens
        if chunk.stats.phase == "prefill":
            prefilled = time.perf_counter()
        else:
            sample.gammas[chunk.stats.drafted] += 1
            sample.drafted += chunk.stats.drafted
            sample.accepted += chunk.stats.accepted
    end = time.perf_counter()
    sample.seconds, sample.decode_seconds = end - start, end - prefilled
    return sample


# --------------------------------------------------------------------------- transformers
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
    config = GenerationConfig(do_sample=False, max_new_tokens=n_new, min_new_tokens=0,
                              eos_token_id=None, pad_token_id=0, num_beams=1)  # fmt: skip
    input_ids = torch.tensor([prompt], dtype=torch.long)

    class Clock(BaseStreamer):
        def __init__(self) -> None:
            self.times: list[float] = []

        def put(self, value: Any) -> None:
            self.times.append(time.perf_counter())

        def end(self) -> None:
            pass

    def once() -> Run:
        clock = Clock()
        with torch.inference_mode():
            out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                 generation_config=config, streamer=clock)  # fmt: skip
        t = clock.times  # [prompt, token 1, ..., token N]
        tokens = [int(x) for x in out[0, len(prompt) :]]
        return Run(t[1] - t[0], t[-1] - t[1], len(prompt), len(t) - 2, tokens)

    yield once


# --------------------------------------------------------------------------- onnxruntime-genai
def genai_python(requested: str | None) -> str:
    """The interpreter that runs genai: `requested`, else this one if it imports genai."""
    if requested:
        return requested
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        raise EngineSkipped(
            "onnxruntime_genai is not importable here; install it (plus onnx-ir for its "
            "builder) or pass --genai-python PYTHON of a venv that has it"
        ) from None
    return sys.executable


def export_genai(folder: Path, out: Path, python: str, threads: int) -> Path:
    """genai's model builder on the local folder (offline, fp32, CPU), once; threads set in
    its genai_config.json."""
    if not (out / ".complete").exists():
        shutil.rmtree(out, ignore_errors=True)
        scratch = out.parent / "genai-builder-cache"
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        cmd = [python, "-m", "onnxruntime_genai.models.builder", "-i", str(folder),
               "-o", str(out), "-p", "fp32", "-e", "cpu", "-c", str(scratch)]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        shutil.rmtree(scratch, ignore_errors=True)
        if proc.returncode != 0 or not (out / "genai_config.json").exists():
            shutil.rmtree(out, ignore_errors=True)
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise RuntimeError(f"genai model builder failed ({' '.join(cmd)}):\n{tail}")
        (out / ".complete").write_text("ok")
    path = out / "genai_config.json"
    config = json.loads(path.read_text())
    options = config["model"]["decoder"].setdefault("session_options", {})
    options.update(intra_op_num_threads=threads, inter_op_num_threads=1)
    path.write_text(json.dumps(config, indent=4))
    return out


@contextmanager
def genai_engine(model_dir: Path, prompt: list[int], n_new: int) -> Iterator[Callable[[], Run]]:
    import numpy as np
    import onnxruntime_genai as og

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
            generator.generate_next_token()
        end = time.perf_counter()
        tokens = [int(t) for t in generator.get_sequence(0)[len(prompt) :]]
        return Run(first - start, end - first, len(prompt), n_new - 1, tokens)

    yield once


def genai_runs(python: str, model_dir: Path, prompt: list[int], args: Any) -> list[Run]:
    cmd = [python, "-m", "benchmarks.lib.engines", "--genai-worker"]
    answer = worker_answer(cmd, {"model_dir": str(model_dir)}, prompt, args, "genai")
    return [Run(**r) for r in answer["runs"]]


def worker_answer(cmd: list[str], model: dict[str, str], prompt: list[int], args: Any,
                  what: str, env: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """Timed generations of another engine in its own interpreter: `cmd + [SPEC.json]` reads
    the spec (the model entry, the prompt and the timing options of `args`) and writes its
    answer (`runs`, and whatever else it reports) to the spec's `out` file."""
    with tempfile.TemporaryDirectory(prefix="bench_worker_") as tmp:
        spec = {**model, "prompt": prompt, "out": str(Path(tmp) / "runs.json")}
        for key in ("new_tokens", "threads", "warmup", "repeats", "quiet_wait", "retries"):
            spec[key] = getattr(args, key)
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        env = dict(env or os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        proc = subprocess.run([*cmd, str(spec_path)], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{what} worker failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
        return json.loads(Path(spec["out"]).read_text())


def _genai_worker(spec_path: str) -> None:
    import onnxruntime
    import onnxruntime_genai

    s = json.loads(Path(spec_path).read_text())
    with genai_engine(Path(s["model_dir"]), s["prompt"], s["new_tokens"]) as once:
        runs = measure(once, s["warmup"], s["repeats"], s["quiet_wait"], s["retries"])
    info = {
        "onnxruntime-genai": onnxruntime_genai.__version__,
        "onnxruntime": onnxruntime.__version__,
    }
    Path(s["out"]).write_text(json.dumps({"runs": [asdict(r) for r in runs], "info": info}))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--genai-worker":
        _genai_worker(sys.argv[2])
    else:
        sys.exit("usage: python -m benchmarks.lib.engines --genai-worker SPEC")
