"""One bundle for Python and JavaScript: a default `edgespec export` runs in the JS package.

A default export's attention takes `query_seqlens` (batched verify rounds, onnxruntime >= 1.32),
which npm's onnxruntime-node (1.30 here; 1.31.1 the newest) refuses to load. The package opens
such graphs without that attention input (`js/src/onnx_edit.ts`) and feeds the rest of the graph
the call's width. Checked here: a bundle exported with the target, a draft model and an exit
layer, batched verify on (what `edgespec export` writes where onnxruntime 1.32 is installed),
gives every JS mode's greedy output (and, for fixed policies, the same drafts proposed and
accepted) equal to the Python runtime's on the same bundle; and the edited graph's logits are
bitwise those of the same model exported with `--no-batched-verify` (the graphs the
conformance suite holds JS to), through a prefill and calls of one and three positions.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import write_chat_checkpoint  # noqa: E402
from test_js_conformance import JS, NODE, build_js  # noqa: E402

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed (Node >= 20 runs js/)")

PROMPT = "def parse(x):\n    return"
NEW = 24
RUNS = [
    ("ar", None, None),
    ("spec", "fixed:3", None),
    ("spec", "auto", None),
    ("self-spec", "fixed:2", 2),
    ("lookup", "fixed:4", None),
]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    from edgespec.export import export_bundle

    root = tmp_path_factory.mktemp("js_default_bundle")
    target = write_chat_checkpoint(root / "t", seed=0)
    draft = write_chat_checkpoint(root / "d", seed=1)
    export_bundle(target, root / "b", draft=draft, exit_layers=[2], batched_verify=True)
    export_bundle(target, root / "plain", batched_verify=False)
    build_js()
    return root / "b"


# node, in js/: logits of full.onnx from the default bundle (edited) and the plain one, per call
BITWISE = """
import { readFileSync } from "node:fs";
import ort from "onnxruntime-node";
import { withoutBatchedAttention } from "./dist/onnx_edit.js";
const [dir, plain] = process.argv.slice(1);
const graph = (d) => JSON.parse(readFileSync(`${d}/manifest.json`)).graphs.find((g) => g.role === "full");
const bytes = withoutBatchedAttention(new Uint8Array(readFileSync(`${dir}/full.onnx`)), "full.onnx");
const folder = { extra: { session: { model_external_initializers_file_folder_path: dir } } };
const edited = await ort.InferenceSession.create(bytes, folder);
const reference = await ort.InferenceSession.create(`${plain}/full.onnx`);
const m = JSON.parse(readFileSync(`${dir}/manifest.json`)).target, cap = 64;
const cache = () => Object.fromEntries(graph(dir).kv_layers.flatMap((i) => ["key", "value"].map((k) =>
  [`${k}.${i}`, new ort.Tensor("float32", new Float32Array(m.num_kv_heads * (cap + 1) * m.head_dim),
    [1, m.num_kv_heads, cap + 1, m.head_dim])])));
const caches = [cache(), cache()];
let past = 0;
const equal = [];
for (const ids of [[5, 9, 33, 100, 7, 8], [12], [40, 41, 42], [3]]) {
  const total = past + ids.length, logits = [];
  for (const [i, session] of [edited, reference].entries()) {
    const feeds = {
      input_ids: new ort.Tensor("int64", BigInt64Array.from(ids, BigInt), [1, ids.length]),
      seqlens_k: new ort.Tensor("int32", Int32Array.of(total - 1), [1]),
      total_seq_len: new ort.Tensor("int32", Int32Array.of(total), []),
      num_logits_to_keep: new ort.Tensor("int64", BigInt64Array.of(BigInt(ids.length)), []),
    };
    if (session.inputNames.includes("query_seqlens")) feeds.query_seqlens = new ort.Tensor("int32", Int32Array.of(ids.length), [1]);
    const fetches = Object.fromEntries(session.outputNames.map((n) => [n, null]));
    for (const [k, v] of Object.entries(caches[i])) { feeds[`past_${k}`] = v; fetches[`present_${k}`] = v; }
    logits.push((await session.run(feeds, fetches)).logits.data);
  }
  equal.push(logits[0].length === logits[1].length && logits[0].every((x, j) => x === logits[1][j]));
  past = total;
}
console.log(JSON.stringify({ inputs: edited.inputNames.includes("query_seqlens"), equal }));
"""


def test_the_edited_graph_gives_the_plain_graphs_logits_bitwise(bundle):
    run = subprocess.run(
        [NODE, "--input-type=module", "-e", BITWISE, str(bundle), str(bundle.parent / "plain")],
        cwd=JS,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {"inputs": True, "equal": [True] * 4}


def test_the_default_bundles_graphs_take_query_seqlens(bundle):
    manifest = json.loads((bundle / "manifest.json").read_text())
    for g in manifest["graphs"]:
        assert "query_seqlens" in [i["name"] for i in g["inputs"]], g["role"]


@pytest.mark.parametrize(("mode", "policy", "exit_layer"), RUNS)
def test_js_runs_a_default_bundle_as_python_does(bundle, mode, policy, exit_layer):
    from edgespec.runtime.model import Model

    options = {"draft_policy": policy} if policy else {}
    want = Model.load(bundle, mode=mode, exit_layer=exit_layer, **options).generate(
        PROMPT, max_new_tokens=NEW, ignore_eos=True
    )
    args = ["--mode", mode, "--max-new-tokens", str(NEW), "--ignore-eos", "--json"]
    args += ["--draft-policy", policy] if policy else []
    args += ["--exit-layer", str(exit_layer)] if exit_layer is not None else []
    run = subprocess.run(
        [NODE, str(JS / "dist" / "cli.js"), "generate", str(bundle), "-p", PROMPT, *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got["tokens"] == want.tokens
    if policy not in (None, "auto"):  # auto plans from measured times
        stats = (got["stats"]["drafted"], got["stats"]["accepted"])
        assert stats == (want.stats.drafted, want.stats.accepted)
