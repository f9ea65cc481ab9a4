"""A distilled head's draft vocabulary: how much of the target's replies N ids cover, and what
a head step costs against a target step with N LM head rows.

Takes a bundle `edgespec distill` made (its `distill/` folder: the target's replies and the
text it read). Per `--sizes` entry N (0: the whole vocabulary): the coverage of the held-out
replies' tokens by the N ids the target most often ranks first on the training samples
(`distill.train.draft_vocabulary`, what distill picks), and the median one-token head step
over a one-token target step (`distill.measure.step_cost`, the same timing distill records)
of a head with those N rows, int8 like a distilled head, written into a copy of the bundle.
The cost depends on the shapes only, so the bundle's own head weights serve for every N.

    python -m benchmarks.draft_vocab B-EAGLE --sizes 2048,4096,8192,16384,0 \\
        --json benchmarks/results/draft_vocab.json
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.lib.flags import listed, parser
from benchmarks.lib.machine import cpu_name, load_line, log
from benchmarks.lib.tables import write_result


def main() -> None:
    p = parser(__doc__)
    p.add_argument("bundle", type=Path)
    p.add_argument("--sizes", type=lambda t: listed(t, int), default=[2048, 4096, 8192, 16384, 0])
    p.add_argument("--calls", type=int, default=60)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()

    from edgespec.bundle import load_manifest
    from edgespec.distill import data
    from edgespec.distill.measure import step_cost
    from edgespec.distill.pipeline import STATE, _target_weights
    from edgespec.distill.train import coverage, draft_vocabulary
    from edgespec.export.eagle import HEAD_QUANTIZE, HeadWeights, write_head

    state = a.bundle / STATE
    samples = data.load(state / "replies")
    text = data.load(state / "text") if (state / "text").exists() else []
    recorded = json.loads((state / "state.json").read_text())
    if "held_out" not in recorded:  # else every reply would count as training, none held out
        raise SystemExit(
            f"{a.bundle}: its distill recorded no held-out replies (made before "
            "sources were held out): distill the bundle again"
        )
    train, held = data.split(samples, recorded["held_out"])
    train += text
    manifest = load_manifest(a.bundle)
    source = manifest.source.get("model")
    weights = _target_weights(str(source))
    import torch

    ckpt = torch.load(state / "checkpoint.pt", weights_only=False)["head"]
    arrays = {k: v.float().numpy() for k, v in ckpt.items()}
    arrays["feature_layers"] = np.asarray(manifest.feature_layers)
    eps = weights.final_norm.eps
    vocab = weights.embed.shape[0]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "b"
        shutil.copytree(a.bundle, copy, ignore=shutil.ignore_patterns(STATE))
        for n in a.sizes:
            ids = draft_vocabulary(train, n, vocab) if 0 < n < vocab else None
            cover = 1.0 if ids is None else coverage(held, ids)
            head = HeadWeights.from_arrays(
                {k: arrays[k] for k in (
                    "fuse", "proj", "qkv", "o", "up", "down", "embed_norm", "state_norm",
                    "attn_norm", "mlp_norm", "feature_layers")}, eps)  # fmt: skip
            head.draft_ids = ids
            shared = manifest.quantization if manifest.quantization in ("int8", "int4") else None
            level = int(manifest.extra.get("accuracy_level", 4))
            batched = any(t.name == "query_seqlens" for t in manifest.graph("full").inputs)
            write_head(copy, weights, head, manifest.dtype, batched, level, HEAD_QUANTIZE, shared)
            cost = step_cost(copy, a.calls)
            row = {"draft_vocab": n or vocab, "coverage": cover, "step_cost": cost}
            log(f"N={row['draft_vocab']}: coverage {cover:.4f}, head step {cost:.3f} target steps")
            rows.append(row)
    result = {"bundle": str(a.bundle), "cpu": cpu_name(), "load": load_line(),
              "held_out_reply_tokens": int(sum(len(s.ids) - s.start for s in held)),
              "train_samples": len(train), "rows": rows}  # fmt: skip
    write_result(a.json, a, result)


if __name__ == "__main__":
    main()
