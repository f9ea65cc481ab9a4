// Node's decode speed per mode on one bundle (benchmarks/js_runtime.py runs it beside Python):
// node js/bench.mjs BUNDLE PROMPTS.json MAX_NEW THREADS KV MODE[:POLICY]... (MODE may be a chain
// of drafters, lookup+eagle: its last member's mode with that drafter)
// PROMPTS.json: a JSON list of prompts. THREADS: 0 = onnxruntime's default. KV: how the KV
// cache comes back (src/graph.ts KVOutputs): "default" (what load() picks), "bound", "appended". Prints one JSON
// object: mode -> { rate: decode tokens/s (tokens after the first over the decode seconds),
// cpu: this process's CPU seconds over the generations (prefill included), tokens: generated },
// after one warm-up generation per mode.
import { readFileSync } from "node:fs";
import { load } from "./dist/node.js";

const [bundle, promptsPath, maxNew, threads, kv, ...modes] = process.argv.slice(2);
const kvOutputs = kv === "default" ? undefined : kv;
const prompts = JSON.parse(readFileSync(promptsPath, "utf-8"));
const sessionOptions = Number(threads) ? { intraOpNumThreads: Number(threads) } : {};
const out = {};
for (const spec of modes) {
  const [name, policy] = spec.split(/:(.*)/s);
  // a chain (lookup+eagle): the mode of its last member with that drafter
  const mode = name.split("+").pop(), drafter = name.includes("+") ? name : undefined;
  const model = await load(bundle, { mode, drafter, draftPolicy: policy || undefined, sessionOptions, kvOutputs });
  const options = { maxNewTokens: Number(maxNew), ignoreEos: true };
  await model.generate(prompts[0], { ...options, maxNewTokens: 16 });
  let decoded = 0, seconds = 0, tokens = 0;
  const start = process.cpuUsage();
  for (const p of prompts) {
    const g = await model.generate(p, options);
    decoded += g.tokens.length - 1;
    tokens += g.tokens.length;
    seconds += g.stats.decodeSeconds;
  }
  const cpu = process.cpuUsage(start);
  out[spec] = { rate: decoded / seconds, cpu: (cpu.user + cpu.system) / 1e6, tokens };
}
console.log(JSON.stringify(out));
