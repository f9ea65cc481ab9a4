// Node's decode speed per mode on one bundle (benchmarks/js_runtime.py runs it beside Python):
// node js/bench.mjs BUNDLE PROMPTS.json MAX_NEW THREADS MODE[:POLICY]...
// PROMPTS.json: a JSON list of prompts. THREADS: 0 = onnxruntime's default. Prints one JSON
// object: mode -> decode tokens/s (tokens after the first over the decode seconds), after one
// warm-up generation per mode.
import { readFileSync } from "node:fs";
import { load } from "./dist/node.js";

const [bundle, promptsPath, maxNew, threads, ...modes] = process.argv.slice(2);
const prompts = JSON.parse(readFileSync(promptsPath, "utf-8"));
const sessionOptions = Number(threads) ? { intraOpNumThreads: Number(threads) } : {};
const out = {};
for (const spec of modes) {
  const [mode, policy] = spec.split(/:(.*)/s);
  const model = await load(bundle, { mode, draftPolicy: policy || undefined, sessionOptions });
  const options = { maxNewTokens: Number(maxNew), ignoreEos: true };
  await model.generate(prompts[0], { ...options, maxNewTokens: 16 });
  let tokens = 0, seconds = 0;
  for (const p of prompts) {
    const g = await model.generate(p, options);
    tokens += g.tokens.length - 1;
    seconds += g.stats.decodeSeconds;
  }
  out[spec] = tokens / seconds;
}
console.log(JSON.stringify(out));
