"""Long prompts vs running sessions on the server's one worker: chunked prefills interleaved.

One session decodes (γ = 0 rounds, one after another, as a device would) on the server's
real worker, model and KV pool, first alone (idle latency), then while `--prompts` other
sessions START with `--prompt-len`-token prompts. Prints, per `--chunks` (most positions per
chunk; 0: each prefill in one piece, as before chunking) and `--budgets-ms` (chunks sized to
take about that long; 0: always the most positions), the running session's round latency
(p50 / p99 / max, ms) during the prefills, its ratio to the idle p50, and the prefills' time.

    python benchmarks/bench_prefill.py                          # a random 2k-context model
    python benchmarks/bench_prefill.py --bundle B --chunks 0,128,256,512
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

import numpy as np

from edgespec.protocol import Start, Verify
from edgespec.serve.session import prefill
from edgespec.serve.state import ServerConfig, load_state

DEFAULT = Path(os.environ.get("EDGESPEC_BENCH", Path.home() / ".cache" / "edgespec-bench"))


def default_bundle() -> Path:
    """A random-weight llama (hidden 256, 4 layers, 2304 positions); built once."""
    out = DEFAULT / "prefill-bundle"
    if not (out / "manifest.json").exists():
        from edgespec.export import export_bundle
        from edgespec.export.builtin import write_checkpoint

        dims = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4)
        dims |= dict(num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2304)
        ckpt = write_checkpoint(DEFAULT / "prefill-ckpt", "llama", **dims)
        export_bundle(ckpt, out)
    return out


async def scenario(state, prompts: list[list[int]], idle_rounds: int) -> dict:
    worker, args = state.worker, (state.pool, state.stages)
    chunk, context = state.config.prefill_chunk, state.max_context
    budget = state.config.prefill_budget_ms / 1000
    running, _ = await worker.steps(
        prefill, *args, Start([1, 2, 3], context), context, [], chunk, budget
    )

    async def one_round() -> float:
        t = time.perf_counter()
        await worker.round((running, Verify(len(running.seq), [])))
        return time.perf_counter() - t

    idle = [await one_round() for _ in range(idle_rounds)]
    t0 = time.perf_counter()
    longs = [
        asyncio.ensure_future(
            worker.steps(prefill, *args, Start(p, len(p) + 2), context, [], chunk, budget)
        )
        for p in prompts
    ]
    busy = []
    while not all(t.done() for t in longs):
        busy.append(await one_round())
    await asyncio.gather(*longs)
    return {"idle": idle, "busy": busy, "prefill_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, default=None)
    ap.add_argument("--chunks", default="0,256")
    ap.add_argument("--budgets-ms", default="0,20", help="prefill_budget_ms values to try")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--prompt-len", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--idle-rounds", type=int, default=50)
    a = ap.parse_args()
    bundle = a.bundle or default_bundle()
    rng = np.random.default_rng(0)
    print(f"load average {os.getloadavg()[0]:.1f}; {a.prompts} prompts of {a.prompt_len} tokens")
    print(
        f"{'chunk':>6} {'budget':>7} {'idle p50':>9} {'p50':>8} {'p99':>8} {'max':>8} "
        f"{'p50/idle':>9} {'rounds':>7} {'prefills s':>10}"
    )
    runs = [(int(c), float(b)) for c in a.chunks.split(",") for b in a.budgets_ms.split(",")]
    for chunk, budget in runs:
        if chunk == 0 and budget:
            continue  # unchunked: no budget applies
        config = ServerConfig(
            str(bundle),
            threads=a.threads,
            max_sessions=a.prompts + 1,
            prefill_chunk=chunk,
            prefill_budget_ms=budget,
        )
        state = load_state(config)
        vocab = state.manifest.target.vocab_size
        prompts = [[int(t) for t in rng.integers(1, vocab, a.prompt_len)] for _ in range(a.prompts)]
        try:
            r = asyncio.run(scenario(state, prompts, a.idle_rounds))
        finally:
            state.worker.stop()
        idle, busy = np.median(r["idle"]) * 1e3, np.asarray(r["busy"]) * 1e3
        p50, p99 = np.percentile(busy, 50), np.percentile(busy, 99)
        print(
            f"{chunk:>6} {budget:>5g}ms {idle:>8.2f}ms {p50:>7.1f}ms {p99:>7.1f}ms "
            f"{busy.max():>7.1f}ms {p50 / idle:>8.1f}x {len(busy):>7} {r['prefill_s']:>10.2f}"
        )
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
