"""Run in a Python whose onnxruntime has the OpenVINO execution provider (onnxruntime-openvino,
which conflicts with the plain onnxruntime wheel, so it usually lives in its own venv):

    $EDGESPEC_OV_PYTHON tests/openvino_worker.py BUNDLE '[[ids...], ...]' MAX_NEW_TOKENS

Greedy-decodes every prompt in every mode the bundle supports on the `cpu` and `openvino`
device profiles and prints one JSON object: tokens per device/mode, and where each node of the
`full` graph ran (from onnxruntime's profiler) on the openvino profile.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import onnxruntime as ort

import edgespec
from edgespec.bundle import load_manifest
from edgespec.devices import get_profile


def modes(folder: Path) -> list[tuple[str, dict]]:
    roles = load_manifest(folder).roles
    out = [("ar", {})]
    if "draft" in roles:
        out.append(("spec", {"mode": "spec", "draft_policy": "fixed:3"}))
    if any(r.startswith("head@") for r in roles):
        out.append(("self-spec", {"mode": "self-spec", "draft_policy": "fixed:3"}))
    out.append(("lookup", {"mode": "lookup", "draft_policy": "fixed:3"}))
    return out


def placement(folder: Path, device: str) -> dict[str, dict[str, int]]:
    """provider -> {op type: count} of the nodes onnxruntime ran for one call of `full`."""
    profile = get_profile(device)
    opts = ort.SessionOptions()
    opts.enable_profiling = True
    opts.log_severity_level = 3
    with tempfile.TemporaryDirectory() as tmp:
        opts.profile_file_prefix = str(Path(tmp) / "prof")
        model = edgespec.load(folder, device=device, shared_threads=False)
        graph = model.target.stages[0].graph
        path = folder / graph.file
        sess = ort.InferenceSession(str(path), opts, providers=profile.session_providers())
        feeds = {}
        import numpy as np

        info = model.manifest.target
        for i in sess.get_inputs():
            if i.name == "input_ids":
                feeds[i.name] = np.array([[1, 2, 3]], np.int64)
            elif i.name == "seqlens_k":
                feeds[i.name] = np.array([2], np.int32)
            elif i.name == "total_seq_len":
                feeds[i.name] = np.array(3, np.int32)
            elif i.name == "num_logits_to_keep":
                feeds[i.name] = np.array(1, np.int64)
            elif i.name == "query_seqlens":
                feeds[i.name] = np.array([3], np.int32)
            else:
                feeds[i.name] = np.zeros((1, info.num_kv_heads, 0, info.head_dim), np.float32)
        sess.run(None, feeds)
        events = json.loads(Path(sess.end_profiling()).read_text())
    where: dict[str, Counter] = {}
    for e in events:
        args = e.get("args", {})
        if e.get("cat") == "Node" and "provider" in args and e["name"].endswith("_kernel_time"):
            where.setdefault(args["provider"], Counter())[args.get("op_name", "?")] += 1
    return {p: dict(c) for p, c in where.items()}


def main() -> None:
    folder, prompts, n = Path(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
    out: dict = {"onnxruntime": ort.__version__, "providers": ort.get_available_providers()}
    for device in ("cpu", "openvino"):
        for name, options in modes(folder):
            model = edgespec.load(folder, device=device, shared_threads=False, **options)
            t0 = time.perf_counter()
            tokens = [model.generate(p, max_new_tokens=n, ignore_eos=True).tokens for p in prompts]
            seconds = time.perf_counter() - t0
            out[f"{device}/{name}"] = {"tokens": tokens, "seconds": seconds}
    out["placement"] = placement(folder, "openvino")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
