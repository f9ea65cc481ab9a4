// Split decoding from Node against a real `edgespec serve` (tests/test_js_split.py):
// node split_check.mjs CASES.json OUT.json. Each case loads the bundle in mode "split" with
// its drafter and policy and either generates from a prompt or runs a chat of several turns
// (the server's session kept between turns); OUT.json holds tokens and stats per case.
import { readFileSync, writeFileSync } from "node:fs";
import { load } from "./dist/node.js";

const [casesPath, outPath] = process.argv.slice(2);
const { bundle, server, token, cases } = JSON.parse(readFileSync(casesPath, "utf-8"));
const out = [];
for (const c of cases) {
  const model = await load(bundle, { mode: "split", split: { server, token }, drafter: c.drafter, draftPolicy: c.policy });
  const sampling = { temperature: c.temperature, topP: c.top_p, topK: c.top_k, seed: c.seed };
  if (c.turns) {
    const replies = [];
    for (const messages of c.turns) replies.push(await model.chat(messages, { maxNewTokens: c.max_new_tokens }));
    out.push({ tokens: replies.map((r) => r.tokens), cached: replies.map((r) => r.cachedTokens) });
  } else {
    const r = await model.generate(c.prompt, { maxNewTokens: c.max_new_tokens, ignoreEos: true, ...sampling });
    out.push({ tokens: r.tokens, drafted: r.stats.drafted, accepted: r.stats.accepted });
  }
  model.verifier.disconnect();
}
writeFileSync(outPath, JSON.stringify(out));
