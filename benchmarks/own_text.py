"""Text for fitting exit adapters (or distilling a draft): a model's own chat replies.

Renders instruct prompts (questions, code to write or rewrite, texts to summarise, built from
the lists below: none of them is a prompt of `bench_real.py`, whose workloads stay held out)
through the bundle's chat template, lets the model answer with plain greedy decoding and
writes each whole conversation (template tokens included, so the fit sees the contexts it
will draft in) to `--out`, separated by blank lines. Deterministic for a bundle.

    python benchmarks/own_text.py /work/cache/smollm2/b-fp32 --out /work/cache/own.txt
    edgespec export HF_DIR --out B --exit-layers 10,20 --fit-exit-adapter /work/cache/own.txt
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

TOPICS = (
    "photosynthesis", "how vaccines work", "the water cycle", "inflation", "black holes",
    "the French revolution", "how a bicycle stays upright", "compound interest", "tides",
    "why we sleep", "how bread rises", "plate tectonics", "the immune system", "rainbows",
    "how batteries work", "machine learning", "the printing press", "volcanoes",
)
TASKS = (
    "reverses a string", "checks whether a number is prime", "counts the vowels in a text",
    "returns the largest of three numbers", "merges two sorted lists", "computes a factorial",
    "removes duplicates from a list keeping order", "converts Celsius to Fahrenheit",
    "reads a file and counts its lines", "finds the most common word in a text",
)
SNIPPETS = (
    "def total(xs):\n    s = 0\n    for x in xs:\n        s = s + x\n    return s\n",
    "def is_even(n):\n    if n % 2 == 0:\n        return True\n    else:\n        return False\n",
    "def greet(name):\n    print('Hello, ' + name + '!')\n\ngreet('Ada')\n",
    "def squares(n):\n    out = []\n    for i in range(n):\n        out.append(i * i)\n"
    "    return out\n",
)
TEXTS = (
    "The museum will open a new wing next month. It will show art from local painters and "
    "host weekend workshops for children. Entry to the new wing is free for the first week.",
    "Researchers found that short walks after meals help control blood sugar. Even ten "
    "minutes made a difference, and the effect was strongest after dinner.",
    "The town plans to plant two thousand trees along its main roads. The trees will give "
    "shade, clean the air and make the streets quieter. Volunteers can sign up online.",
)


def prompts() -> list[str]:
    out = [f"Explain {t} in a short paragraph." for t in TOPICS]
    out += [f"Write a Python function that {t}." for t in TASKS]
    out += [f"Rewrite this code to be clearer and add type hints:\n\n{c}" for c in SNIPPETS]
    out += [f"Summarise this text in one or two sentences:\n\n{t}" for t in TEXTS]
    out += [f"Give three tips about {t}." for t in TOPICS[:8]]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    from edgespec.runtime.model import Model

    model = Model.load(args.bundle, mode="ar", threads=args.threads)
    if model.manifest.chat is None:
        raise SystemExit(f"{args.bundle} has no chat template: give a chat model's bundle")
    start, tokens, asked = time.time(), 0, prompts()
    with args.out.open("w") as out:  # a conversation at a time: a long run shows progress
        for i, text in enumerate(asked):
            ids = model.chat_session().prepare([{"role": "user", "content": text}]).ids
            reply = model.generate(ids, max_new_tokens=args.max_new_tokens)
            out.write(model.tokenizer.decode(ids + reply.tokens, skip_special_tokens=False))
            out.write("\n\n")
            out.flush()
            tokens += len(ids) + len(reply.tokens)
            print(f"{i + 1}/{len(asked)} conversations, {tokens} tokens", flush=True)
    print(
        f"wrote {args.out}: {len(asked)} conversations, {tokens} tokens in "
        f"{time.time() - start:.0f} s (load average {os.getloadavg()[0]:.1f})"
    )


if __name__ == "__main__":
    main()
