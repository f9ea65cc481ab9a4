"""Acceptance traces of the trained pair, for `bench_policy.py --scenarios file:PATH`.

Greedy speculative decoding is fully described by one bit per output position: "the drafter's
greedy token, given the target's own greedy prefix, equals the target's token". This script
writes those bits for a bench_auto prompt set and one drafter (the draft model, or head@k for
self-spec), concatenated over the prompts: the target's greedy continuation comes from `ar`,
the drafter's predictions from one teacher-forced forward of its graph over the whole sequence.
A policy replayed on the trace meets the real runs of easy and hard tokens, with no model run.

    python benchmarks/acceptance_trace.py --drafter exit:2 --out /tmp/trace_code_exit2.txt
    python benchmarks/bench_policy.py --scenarios file:/tmp/trace_code_exit2.txt --costs trained@2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from auto_rows import SETS, load_prompts
from common import DEFAULT_MODELS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, default=DEFAULT_MODELS / "trained")
    ap.add_argument("--set", default="code", choices=sorted(SETS))
    ap.add_argument("--drafter", default="draft", help="'draft' or 'exit:K'")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    import edgespec
    from edgespec.runtime.stack import Stack

    bundle = args.models / "bundle"
    kind, _, k = args.drafter.partition(":")
    if kind == "exit":
        model = edgespec.load(bundle, mode="self-spec", exit_layer=int(k))
        drafter = Stack([model.drafter.heads[int(k)]], logits="exit_logits")
    elif kind == "draft":
        model = edgespec.load(bundle, mode="spec")
        drafter = model.drafter.model
    else:
        sys.exit(f"unknown drafter {args.drafter!r}: 'draft' or 'exit:K'")
    ar = edgespec.load(bundle)
    bits: list[int] = []
    for text in load_prompts(args.models, args.set, args.prompts):
        prompt = ar.encode(text)
        out = list(ar.generate(prompt, max_new_tokens=args.max_new_tokens, ignore_eos=True).tokens)
        seq = prompt + out
        drafter.reset(len(seq))
        logits = drafter.forward(np.asarray(seq[:-1], np.int64), keep=len(out))
        bits += [int(p == t) for p, t in zip(logits.argmax(-1).tolist(), out, strict=True)]
    args.out.write_text("\n".join(map(str, bits)) + "\n")
    print(f"{len(bits)} positions, {np.mean(bits):.3f} agree -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
