// The app's event loop during a generation (tests/test_js_event_loop.py, benchmarks):
// node event_loop.mjs BUNDLE OUT.json [PROMPT_TOKENS] [NEW_TOKENS]. For the model on the app's
// thread ("main") and in a worker ("worker"): a 10 ms interval timer runs through one `ar`
// generation of PROMPT_TOKENS ids (a long prefill) then NEW_TOKENS; the ticks it got, their
// lateness (ms past the 10 ms each), the chunks (one graph call each in `ar`) and the time.
// Then, in a worker, an AbortSignal fired by a timer during the prefill: the error, the chunks
// read after it, the rounds the worker finished after it, and the next generation's equality.
import { writeFileSync } from "node:fs";
import os from "node:os";
import { load } from "./dist/node.js";

const [bundle, outPath, promptArg, newArg] = process.argv.slice(2);
const promptTokens = Number(promptArg ?? 4000), newTokens = Number(newArg ?? 3);
const ids = Array.from({ length: promptTokens }, (_, i) => 10 + ((i * 7) % 1000));
const options = { maxNewTokens: newTokens, ignoreEos: true };

function quantile(sorted, q) {
  return sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] : null;
}

async function measure(thread) {
  const model = await load(bundle, { mode: "ar", thread });
  await model.generate(ids.slice(0, 8), { maxNewTokens: 2, ignoreEos: true }); // warm
  const late = [];
  let last = performance.now();
  const timer = setInterval(() => {
    const t = performance.now();
    late.push(t - last - 10);
    last = t;
  }, 10);
  const start = performance.now();
  let chunks = 0, tokens = [];
  for await (const chunk of model.stream(ids, options)) {
    chunks += 1;
    tokens = tokens.concat(chunk.tokens);
  }
  const seconds = (performance.now() - start) / 1000;
  clearInterval(timer);
  await model.close?.();
  const sorted = late.map((x) => Math.max(0, x)).sort((a, b) => a - b);
  return {
    thread, ticks: late.length, chunks, seconds, tokens,
    lateness_ms: { p50: quantile(sorted, 0.5), p99: quantile(sorted, 0.99), max: sorted.at(-1) ?? null },
  };
}

async function abortDuringPrefill() {
  const model = await load(bundle, { mode: "ar", thread: "worker" });
  const short = { maxNewTokens: 24, ignoreEos: true };
  const before = await model.generate(ids.slice(0, 16), short);
  const controller = new AbortController();
  let error = null, read = 0;
  const timer = setTimeout(() => controller.abort(), 5); // in the prefill
  try {
    for await (const _ of model.stream(ids, { maxNewTokens: 64, ignoreEos: true, signal: controller.signal })) read += 1;
  } catch (e) {
    error = e.name;
  }
  clearTimeout(timer);
  const roundsAfterAbort = model.roundsAfterAbort;
  const after = await model.generate(ids.slice(0, 16), short);
  await model.close();
  return { error, read, roundsAfterAbort, same: JSON.stringify(before.tokens) === JSON.stringify(after.tokens) };
}

const out = {
  bundle, prompt_tokens: promptTokens, new_tokens: newTokens, cpu: os.cpus()[0]?.model ?? null,
  cores: os.cpus().length, load_before: os.loadavg(), runs: [],
};
for (const thread of ["main", "worker"]) out.runs.push(await measure(thread));
out.abort = await abortDuringPrefill();
out.load_after = os.loadavg();
writeFileSync(outPath, JSON.stringify(out, null, 1));
