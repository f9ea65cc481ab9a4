"""What a distilled head buys end to end, measured where it was distilled: the bundle decoding
instruct prompts as a user's loads do (`ar`, prompt lookup, the head alone, lookup+eagle:
`modes.DEFAULT_EAGLE_DRAFTER`), greedy, with `auto` (numpy + onnxruntime; no torch).

`step_cost(bundle)`: a head step's time over a target step's, measured here.
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
import time
from pathlib import Path

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


def step_cost(out: Path, calls: int = 30) -> float:
    """Median seconds of a one-token head step over a one-token target step, measured here."""
    import numpy as np

    from edgespec.runtime.graphs.kv_cache import KVCache
    from edgespec.runtime.graphs.opener import open_bundle
    from edgespec.runtime.graphs.protocol import Feed
    from edgespec.runtime.graphs.stack import Stack

    graphs = open_bundle(out)
    m = graphs.manifest.target
    full, head = Stack([graphs.open("full")]), graphs.open("eagle")
    full.reset(calls + 4)
    cache = KVCache.allocate([0], m.num_kv_heads, m.head_dim, calls + 4, head.kv_dtype)
    width = len(graphs.manifest.feature_layers) * m.hidden_size
    feed = {"features": np.zeros((1, 1, width), np.float32),
            "state": np.zeros((1, 1, m.hidden_size), np.float32)}  # fmt: skip
    t_full, t_head = [], []
    for i in range(calls):
        t0 = time.perf_counter()
        full.forward(np.array([1 + i], np.int64), keep=1)
        t1 = time.perf_counter()
        head.run(cache, i, Feed(input_ids=np.array([[1 + i]], np.int64), keep=1), extra=feed)
        t_full.append(t1 - t0)
        t_head.append(time.perf_counter() - t1)
    return round(float(np.median(t_head[3:]) / np.median(t_full[3:])), 3)
