#!/usr/bin/env node
/** `npx edgespec generate BUNDLE -p PROMPT [--mode MODE] [--draft-policy fixed:N] ...`:
prints the text as it streams (and, with --stats, the generation's stats to stderr);
`--json` prints one JSON object instead ({text, tokens, stats}). */

import { readFile } from "node:fs/promises";
import { parseArgs } from "node:util";
import { EdgespecError } from "./errors.js";
import { load } from "./node.js";
import type { Mode } from "./model.js";

const USAGE = `usage: edgespec generate BUNDLE -p PROMPT [--mode ar|spec|self-spec|eagle|lookup|split (default: the bundle's fastest)]
       [--server ws://HOST:PORT] [--token-file FILE] [--drafter draft|lookup (split) | draft|lookup+draft (spec) | eagle|lookup+eagle (eagle)]
       [--draft-policy auto|acceptance|fixed:N|confidence:T] [--exit-layer K] [--max-new-tokens N] [--temperature T]
       [--top-p P] [--top-k K] [--seed S] [--ignore-eos] [--chat] [--stats] [--json]`;

async function main(argv: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      prompt: { type: "string", short: "p" },
      mode: { type: "string" }, // none: the bundle's fastest (resolveMode)
      "draft-policy": { type: "string" },
      "exit-layer": { type: "string" },
      server: { type: "string" },
      "token-file": { type: "string" },
      drafter: { type: "string" },
      "max-new-tokens": { type: "string", default: "128" },
      temperature: { type: "string", default: "0" },
      "top-p": { type: "string", default: "1" },
      "top-k": { type: "string", default: "0" },
      seed: { type: "string" },
      "ignore-eos": { type: "boolean", default: false },
      chat: { type: "boolean", default: false },
      stats: { type: "boolean", default: false },
      json: { type: "boolean", default: false },
      help: { type: "boolean", short: "h", default: false },
    },
  });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  const [command, bundle] = positionals;
  if (command !== "generate" || !bundle || values.prompt === undefined) {
    console.error(USAGE);
    return 2;
  }
  const num = (name: string, v: string | undefined): number | undefined => {
    if (v === undefined) return undefined;
    const n = Number(v);
    if (!Number.isFinite(n)) throw new EdgespecError(`--${name} takes a number, got '${v}'`);
    return n;
  };
  let token: string | undefined;
  if (values["token-file"] !== undefined) {
    token = (await readFile(values["token-file"], "utf-8").catch(() => {
      throw new EdgespecError(`--token-file ${values["token-file"]} cannot be read: give the file holding the server's token`);
    })).trim();
  }
  const model = await load(bundle, {
    mode: values.mode as Mode,
    draftPolicy: values["draft-policy"],
    exitLayer: num("exit-layer", values["exit-layer"]),
    split: values.server !== undefined || token !== undefined ? { server: values.server ?? "", token } : undefined,
    drafter: values.drafter as "draft" | "lookup" | "eagle" | "lookup+eagle" | undefined,
  });
  const prompt = values.chat ? model.renderChat([{ role: "user", content: values.prompt }]) : values.prompt;
  const options = {
    maxNewTokens: num("max-new-tokens", values["max-new-tokens"]),
    temperature: num("temperature", values.temperature),
    topP: num("top-p", values["top-p"]),
    topK: num("top-k", values["top-k"]),
    seed: num("seed", values.seed),
    ignoreEos: values["ignore-eos"],
  };
  if (values.json) {
    const g = await model.generate(prompt, options);
    console.log(JSON.stringify({ text: g.text, tokens: g.tokens, finishReason: g.finishReason, stats: g.stats }));
    return 0;
  }
  const controller = new AbortController();
  process.once("SIGINT", () => controller.abort());
  const stats = { rounds: 0, drafted: 0, accepted: 0, tokens: 0, seconds: 0 };
  for await (const chunk of model.stream(prompt, { ...options, signal: controller.signal })) {
    process.stdout.write(chunk.text);
    stats.tokens += chunk.tokens.length;
    if (chunk.stats.kind === "decode") {
      stats.rounds += 1;
      stats.drafted += chunk.stats.drafted;
      stats.accepted += chunk.stats.accepted;
      stats.seconds += chunk.stats.seconds;
    }
  }
  process.stdout.write("\n");
  if (values.stats) {
    const rate = stats.drafted ? (stats.accepted / stats.drafted).toFixed(2) : "-";
    console.error(
      `${stats.tokens} tokens, ${stats.rounds} rounds, ${stats.drafted} drafted, ${stats.accepted} accepted ` +
        `(rate ${rate}), decode ${((stats.tokens - 1) / stats.seconds).toFixed(1)} tokens/s`,
    );
  }
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (e) => {
    if (e instanceof EdgespecError || (e instanceof Error && e.name === "TypeError" && e.message.includes("parseArgs"))) {
      console.error(`edgespec: ${e.message}`);
      return process.exit(2);
    }
    if (e instanceof Error && "code" in e && String(e.code).startsWith("ERR_PARSE_ARGS")) {
      console.error(`edgespec: ${e.message}\n${USAGE}`);
      return process.exit(2);
    }
    throw e;
  },
);
