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
  const split = { server, token, localFallback: c.local_fallback ?? true };
  const model = await load(bundle, { mode: "split", split, drafter: c.drafter, draftPolicy: c.policy });
  const sampling = { temperature: c.temperature, topP: c.top_p, topK: c.top_k, seed: c.seed };
  if (c.turns) {
    const replies = [];
    for (const messages of c.turns) replies.push(await model.chat(messages, { maxNewTokens: c.max_new_tokens }));
    out.push({ tokens: replies.map((r) => r.tokens), cached: replies.map((r) => r.cachedTokens) });
  } else if (c.pause_after) {
    // streams; after `pause_after` chunks prints "paused" and waits for a line on stdin (the
    // test kills the server meanwhile), then streams the rest
    const tokens = [];
    let chunks = 0;
    for await (const chunk of model.stream(c.prompt, { maxNewTokens: c.max_new_tokens, ignoreEos: true, ...sampling })) {
      tokens.push(...chunk.tokens);
      if (++chunks === c.pause_after) {
        process.stdout.write("paused\n");
        await new Promise((resolve) => process.stdin.once("data", resolve));
        process.stdin.pause();
      }
    }
    out.push({ tokens, chunks, down: model.verifier.down ?? null });
  } else {
    const r = await model.generate(c.prompt, { maxNewTokens: c.max_new_tokens, ignoreEos: true, ...sampling });
    out.push({ tokens: r.tokens, drafted: r.stats.drafted, accepted: r.stats.accepted });
  }
  model.verifier.disconnect();
}
writeFileSync(outPath, JSON.stringify(out));
