// Reproduces conformance vectors written by the Python runtime (tests/test_js_conformance.py):
// node conformance.mjs VECTORS.json OUT.json. For each bundle: token ids of each text,
// rendered chat templates, and greedy generations per mode (on each of `vectors.threads`:
// "worker", load()'s default, "main", the app's thread, and "bytes": the browser's and React
// Native's route, graphs and their external data handed over as bytes, under onnxruntime-node;
// "bound", the app's thread with the KV cache passed as preallocated outputs);
// OUT.json holds what this package
// produced, for the Python test to compare item by item.
import { readFileSync, writeFileSync } from "node:fs";
import { ChatTemplate, folderFiles, load, loadModel } from "./dist/node.js";
import { parsePolicy } from "./dist/policies.js";

const [vectorsPath, outPath] = process.argv.slice(2);
const vectors = JSON.parse(readFileSync(vectorsPath, "utf-8"));
const out = { tokenizer: [], decode: [], templates: [], generations: [], chats: [], errors: [] };

for (const t of vectors.templates) {
  const template = new ChatTemplate({ default: t.template }, t.special_tokens);
  let text;
  try {
    text = template.render(t.messages, { flags: t.flags, tools: t.tools ?? undefined });
  } catch (e) {
    text = `error: ${e.message}`;
  }
  out.templates.push({ name: t.name, text });
}

const options = (g) => ({ mode: g.mode, draftPolicy: g.policy ?? undefined, exitLayer: g.exit_layer ?? undefined, drafter: g.drafter ?? undefined });
const threads = vectors.threads ?? ["worker"];
const open = async (path, options, thread) => {
  // "bound": the KV path of a binding that hands preallocated outputs back (src/graph.ts)
  if (thread === "bound") return load(path, { ...options, thread: "main", kvOutputs: "bound" });
  if (thread !== "bytes") return load(path, { ...options, thread });
  const { path: _, ...files } = folderFiles(path); // no paths: graphs and weights as bytes
  return loadModel(files, await import("onnxruntime-node"), options);
};
for (const thread of threads) for (const b of vectors.bundles) {
  for (const g of b.generations) {
    let model;
    try {
      model = await open(b.path, options(g), thread);
    } catch (e) {
      out.errors.push(`${thread} ${b.name} ${g.mode}: ${e.message}`);
      continue;
    }
    if (g === b.generations[0] && thread === threads[0]) {
      for (const text of b.texts) out.tokenizer.push({ bundle: b.name, text, ids: model.tokenizer.encode(text) });
      for (const ids of b.decode) {
        const detok = model.tokenizer.streamDecoder(true);
        const streamed = [...ids.map((id) => detok.push(id)), detok.flush()];
        out.decode.push({ bundle: b.name, ids, text: model.tokenizer.decode(ids, true), streamed });
      }
    }
    const prompt = g.chat ? model.renderChat(g.chat) : g.prompt;
    const sampling = g.sampling ?? {};
    const r = await model.generate(prompt, {
      maxNewTokens: g.max_new_tokens, ignoreEos: g.ignore_eos,
      temperature: sampling.temperature, topP: sampling.top_p, topK: sampling.top_k, seed: sampling.seed,
    });
    await model.close?.(); // a worker's thread ends
    out.generations.push({
      thread, bundle: b.name, mode: g.mode, policy: g.policy, drafter: g.drafter ?? null, prompt: g.prompt, chat: g.chat ?? null,
      tokens: r.tokens, text: r.text, finish_reason: r.finishReason,
      drafted: r.stats.drafted, accepted: r.stats.accepted,
    });
  }
}
for (const b of vectors.bundles) {
  for (const c of b.chats) {
    const model = await load(b.path, options(c));
    const replies = [];
    for (const messages of c.turns) replies.push(await model.chat(messages, { maxNewTokens: c.max_new_tokens }));
    out.chats.push({ bundle: b.name, mode: c.mode, tokens: replies.map((r) => r.tokens), cached: replies.map((r) => r.cachedTokens) });
  }
}
// cancellation: an AbortSignal ends a stream with AbortError between rounds, and the model
// generates again afterwards exactly as before
{
  const b = vectors.bundles[0];
  const abort = vectors.abort ?? { mode: "spec", drafter: null };
  const model = await load(b.path, { mode: abort.mode, drafter: abort.drafter ?? undefined, draftPolicy: "fixed:2" });
  const options = { maxNewTokens: 24, ignoreEos: true };
  const before = await model.generate("def f(x):", options);
  const controller = new AbortController();
  let error = null, chunks = 0;
  try {
    for await (const _ of model.stream("def f(x):", { ...options, signal: controller.signal })) {
      chunks += 1;
      controller.abort();
    }
  } catch (e) {
    error = e.name;
  }
  const after = await model.generate("def f(x):", options);
  out.abort = { error, chunks, same: JSON.stringify(before.tokens) === JSON.stringify(after.tokens) };
}
// the adaptive policies over the same stream of round outcomes as Python's
out.policies = vectors.policies.map(({ name, table }) => {
  const policy = parsePolicy(name);
  const plans = [];
  for (let i = 0; i < table.accepted.length; i++) {
    const g = policy.plan(null).length;
    plans.push(g);
    const n = Math.min(g, table.accepted[i]);
    const draft = g * table.draft[i];
    const seconds = table.base[i] + g * table.verify[i] + draft;
    policy.observe({
      kind: "decode", tokens: n + 1, positions: g + 1, seconds, drafted: g, accepted: n,
      draftSeconds: draft, verifySeconds: 0, source: null, exitLayer: null, index: (i % 60) + 1,
      catchupSeconds: 0,
    });
  }
  return { name, plans };
});
writeFileSync(outPath, JSON.stringify(out));
