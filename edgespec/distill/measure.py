"""What a distilled head buys end to end, measured where it was distilled: the bundle decoding
instruct prompts as a user's loads do (`ar`, prompt lookup, the head alone, lookup+eagle:
`modes.DEFAULT_EAGLE_DRAFTER`), greedy, with `auto` (numpy + onnxruntime; no torch).

`decode_speedup(bundle)` -> {"lookup": x, "eagle": x, "lookup+eagle": x}: decode tokens per
second over `ar`'s on calibrate.PROMPTS (a question, a code rewrite, a summary: the text a chat
model writes, not the distill prompts the head learned on), each prompt decoded by every
drafter in turn `repeats` times (a shared machine's load drifts: interleaved, it drifts for
all alike) after one warm-up call each. What `costs.best_local` reads (`eagle_pays`): on
SmolLM2-135M-Instruct's Q4_1 file the held-out acceptance over the head's step cost promised
1.10x where the head alone decoded the workloads at 0.94–1.09x `ar`, and lookup alone beat
lookup+eagle on every one.
"""

from __future__ import annotations

import os

# label -> Model.load options: the drafters a load of a bundle with a head can decode with
LOADS = {
    "ar": {"mode": "ar"},
    "lookup": {"mode": "lookup"},
    "eagle": {"mode": "eagle"},
    "lookup+eagle": {"mode": "eagle", "drafter": "lookup+eagle"},
}


def decode_speedup(
    bundle: str | os.PathLike,
    threads: int | None = None,
    new_tokens: int = 64,
    repeats: int = 2,
) -> dict[str, float]:
    """Each drafter's decode tokens per second over `ar`'s (module doc)."""
    from edgespec.runtime.calibrate import PROMPTS, prompt_ids
    from edgespec.runtime.model import Model

    models = {k: Model.load(bundle, threads=threads, **o) for k, o in LOADS.items()}
    prompts = [prompt_ids(models["ar"], text) for text in PROMPTS]
    for m in models.values():  # onnxruntime's first calls are slower
        m.generate(prompts[0], max_new_tokens=4, ignore_eos=True)
    tokens = dict.fromkeys(models, 0)
    seconds = dict.fromkeys(models, 0.0)
    for _ in range(repeats):
        for ids in prompts:
            for k, m in models.items():
                stats = m.generate(ids, max_new_tokens=new_tokens, ignore_eos=True).stats
                tokens[k] += stats.decode_tokens
                seconds[k] += stats.decode_seconds
    rate = {k: tokens[k] / seconds[k] if seconds[k] else 0.0 for k in models}
    return {k: round(rate[k] / rate["ar"], 3) for k in models if k != "ar" and rate["ar"]}
