// Which KV path load() takes (src/graph.ts KVOutputs), on the installed onnxruntime-node and on
// a binding that hands preallocated outputs back in the caller's buffers (the installed one
// wrapped to return them, as onnxruntime PR #32346 makes `run` do), and an `ar` generation on
// each (tests/test_js_default_bundle.py): node kv_check.mjs BUNDLE PROMPT N prints
// {version, inPlace, kv, tokens}: per binding [installed, wrapped], what `outputsInPlace` found,
// the KV path of the full graph, and the generated tokens.
import ort from "onnxruntime-node";
import { folderFiles, loadModel } from "./dist/node.js";
import { outputsInPlace } from "./dist/graph.js";

const [dir, prompt, n] = process.argv.slice(2);

// a binding whose run returns the caller's preallocated tensors (filled by onnxruntime)
const wrapped = {
  ...ort,
  InferenceSession: {
    create: async (...args) => {
      const session = await ort.InferenceSession.create(...args);
      return new Proxy(session, {
        get(target, key) {
          if (key !== "run") return Reflect.get(target, key);
          return async (feeds, fetches, options) => {
            const out = await target.run(feeds, fetches, options);
            for (const [name, t] of Object.entries(fetches ?? {})) if (t) out[name] = t;
            return out;
          };
        },
      });
    },
  },
};

const result = { version: ort.env.versions?.node ?? null, inPlace: [], kv: [], tokens: [] };
for (const binding of [ort, wrapped]) {
  result.inPlace.push(await outputsInPlace(binding));
  const model = await loadModel(folderFiles(dir), binding, { mode: "ar", sessionOptions: { intraOpNumThreads: 1 } });
  result.kv.push(model.verifier.target.stages[0].kvOutputs);
  result.tokens.push((await model.generate(prompt, { maxNewTokens: Number(n), ignoreEos: true })).tokens);
}
console.log(JSON.stringify(result));
