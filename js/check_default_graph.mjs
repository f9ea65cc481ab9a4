// Logits of a default bundle's full.onnx opened as the package opens it (its attention's
// query_seqlens dropped, src/onnx_edit.ts) and of the same model exported with
// --no-batched-verify, call by call (tests/test_js_default_bundle.py):
// node check_default_graph.mjs DEFAULT_BUNDLE PLAIN_BUNDLE PROMPT N prints {inputs, equal: [per
// call], bytesTokens}: bytesTokens, an `ar` generation of N tokens over the default bundle read as
// bytes only (no paths: the route of the browser and React Native, weights as external data).
import { readFileSync } from "node:fs";
import ort from "onnxruntime-node";
import { withoutBatchedAttention } from "./dist/onnx_edit.js";
import { folderFiles, loadModel } from "./dist/node.js";
const [dir, plain, prompt, n] = process.argv.slice(2);
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
const { path: _, ...bytesOnly } = folderFiles(dir);
const model = await loadModel(bytesOnly, ort, { mode: "ar" });
const { tokens: bytesTokens } = await model.generate(prompt, { maxNewTokens: Number(n), ignoreEos: true });
console.log(JSON.stringify({ inputs: edited.inputNames.includes("query_seqlens"), equal, bytesTokens }));
