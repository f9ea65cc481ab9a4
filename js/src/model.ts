/** The object an app holds (`runtime/model.py`): a loaded bundle that turns prompts into text.

`loadModel(files, ort, options)` validates the manifest, opens the graphs the mode needs and
reads the tokenizer and chat template; `stream()` yields text pieces as tokens are produced,
`generate()` returns the whole result with its stats. Bad input is refused here, before any
work, with an `InputError` saying what to change. The name table: modes `ar` (no drafter),
`spec` (the bundle's draft model; drafter `lookup+draft`: prompt lookup first), `self-spec` (head@k drafts, tail@k verifies over its KV),
`eagle` (the bundle's feature head, made by `edgespec distill`, drafting from the target's
features; drafter `lookup+eagle`: prompt lookup first, the head where it finds nothing, as the
Python runtime's default for a distilled bundle whose head pays), `lookup` (prompt lookup);
policies `auto` (the default), `acceptance`, `fixed:N`,
`confidence:T`. */

import type * as ortTypes from "onnxruntime-common";
import { bestLocal, exitLayers, findGraph, loadManifest, modelInfo, type Manifest } from "./bundle.js";
import { ChatTemplate, type Message, type RenderOptions } from "./chat.js";

export function commonPrefix(a: number[], b: number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}
import { decode } from "./decode.js";
import { Chain, EagleDrafter, EarlyExitDrafter, LookupDrafter, ModelDrafter, NoDrafter } from "./drafters.js";
import { InputError } from "./errors.js";
import type { BundleFiles } from "./files.js";
import { GraphSession, outputsInPlace, settleStepWidth, Stack, type KVOutputs, type Ort } from "./graph.js";
import { FallbackVerifier } from "./fallback.js";
import { LocalVerifier } from "./local.js";
import { parsePolicy, perSource, type DraftLengthPolicy } from "./policies.js";
import { samplingParams, type SamplingParams } from "./sampling.js";
import { GenerationStats, type Drafter, type RoundStats, type Verifier } from "./round.js";
import { Tokenizer } from "./tokenizer.js";
import { RemoteVerifier, type SplitOptions } from "./remote.js";
import { DEFAULT_SUPPORT } from "./draftq.js";
import { appendingOutputs, externalFiles, withoutBatchedAttention } from "./onnx_edit.js";

export const MODES = ["ar", "spec", "self-spec", "eagle", "lookup", "split"] as const;
/** The drafters a mode may be given (`drafter`); the first is its default (split: "draft"
 * where the bundle has a draft model). */
const DRAFTERS: Partial<Record<Mode, readonly string[]>> = {
  split: ["draft", "lookup"],
  spec: ["draft", "lookup+draft"],
  eagle: ["eagle", "lookup+eagle"],
};
export type Mode = (typeof MODES)[number];

export interface LoadOptions {
  /** Without one: the mode the bundle decodes fastest in, as the Python runtime picks it
   * without a calibration (`resolveMode`, `bestLocal`). */
  mode?: Mode;
  /** "auto" (the default: speculates only while it is measured to win), "acceptance",
   * "fixed:N" or "confidence:T"; `ar` takes none. */
  draftPolicy?: string;
  /** self-spec: the exit to draft from (default: the deepest exported). */
  exitLayer?: number;
  /** onnxruntime session options (execution providers, threads). */
  sessionOptions?: ortTypes.InferenceSession.SessionOptions;
  /** split: the server (`edgespec serve`) that verifies, its token, a WebSocket class. */
  split?: SplitOptions;
  /** split: what drafts on the device: "draft" (the bundle's draft model; the default when
   * the bundle has one) or "lookup" (prompt lookup). spec: "draft" (the default) or
   * "lookup+draft" (prompt lookup first, the draft model where it finds nothing). eagle:
   * "eagle" (the feature head; the default) or "lookup+eagle" (the same with the head). */
  drafter?: "draft" | "lookup" | "lookup+draft" | "eagle" | "lookup+eagle";
  /** How the onnxruntime binding returns KV outputs (`KVOutputs`): by default "bound" where
   * it hands preallocated outputs back in place, else "appended" (onnxruntime-node 1.30/1.31);
   * "returned" or "concatenated" for onnxruntime-web. */
  kvOutputs?: KVOutputs;
  /** Called with a line per step while the bundle loads. */
  onProgress?: (message: string) => void;
}

export interface GenerateOptions {
  maxNewTokens?: number;
  temperature?: number;
  topP?: number;
  topK?: number;
  seed?: number;
  ignoreEos?: boolean;
  signal?: AbortSignal;
}

export interface ChatOptions extends GenerateOptions, RenderOptions {}

export interface ChatReply {
  text: string;
  tokens: number[];
  promptTokens: number;
  cachedTokens: number; // of promptTokens: kept in the KV caches from the last turn, not prefilled
  finishReason: string; // "stop" (an end-of-turn id) | "length"
  stats: GenerationStats;
}

const FINISH: Record<string, string> = { eos: "stop", length: "length", context: "length" };

export interface Chunk {
  text: string;
  tokens: number[];
  stats: RoundStats;
  finishReason: string | null;
}

export interface Generation {
  text: string;
  tokens: number[];
  promptTokens: number[];
  finishReason: string;
  stats: GenerationStats;
}

export type Prompt = string | number[];

/** The mode, drafter and exit layer a load runs (`runtime/model.py` `resolve_mode`): as asked;
 * without a mode, split where its options are given, self-spec where an exit layer is, the
 * mode of a named drafter, else the bundle's fastest (`bestLocal`). */
export function resolveMode(manifest: Manifest, options: LoadOptions): { mode: Mode; drafter?: string; exitLayer?: number } {
  const { mode, drafter, exitLayer } = options;
  if (mode !== undefined) return { mode, drafter, exitLayer };
  if (options.split) return { mode: "split", drafter };
  if (exitLayer !== undefined) return { mode: "self-spec", drafter, exitLayer };
  if (drafter !== undefined) return { mode: DRAFTERS.eagle!.includes(drafter) ? "eagle" : "spec", drafter };
  const best = bestLocal(manifest);
  return { mode: best.mode, drafter: best.drafter, exitLayer: best.exitLayer };
}

export async function loadModel(files: BundleFiles, ort: Ort, options: LoadOptions = {}): Promise<Model> {
  const progress = options.onProgress ?? (() => {});
  const readManifest = () => {
    progress(`reading ${files.where}/manifest.json`);
    return loadManifest(files);
  };
  // without a mode, the bundle says which (read first); else bad options are refused first
  const early = options.mode === undefined ? await readManifest() : null;
  const chosen = early ? resolveMode(early, options) : { mode: options.mode!, drafter: options.drafter, exitLayer: options.exitLayer };
  const mode = chosen.mode, exitLayer = chosen.exitLayer;
  options = { ...options, drafter: chosen.drafter as LoadOptions["drafter"] };
  if (!MODES.includes(mode)) {
    throw new InputError(`mode '${mode}' is not one of: ${MODES.join(", ")}`);
  }
  if (mode === "split" && !options.split?.server) {
    throw new InputError("split mode needs a server: { split: { server: \"ws://HOST:PORT\" } } (--server)");
  }
  if (mode !== "split" && options.split) {
    throw new InputError(`split and drafter are split mode's options: drop them, or use mode 'split' (not '${mode}')`);
  }
  const drafters = DRAFTERS[mode];
  if (options.drafter !== undefined && !drafters) {
    throw new InputError(`split and drafter are split mode's options (drafter: also spec's and eagle's): drop drafter, or use mode 'split', 'spec' or 'eagle' (not '${mode}')`);
  }
  if (options.drafter !== undefined && !drafters!.includes(options.drafter)) {
    throw new InputError(`drafter '${options.drafter}' is not one of mode ${mode}'s: ${drafters!.join(", ")}`);
  }
  if (mode === "ar" && options.draftPolicy != null) {
    throw new InputError("mode 'ar' drafts nothing: drop draftPolicy (--draft-policy)");
  }
  let policy = parsePolicy(mode === "ar" ? "fixed:0" : options.draftPolicy ?? "auto");
  const manifest = early ?? await readManifest();
  // Each session owns its thread pool (the JavaScript API has no process-wide one): a mode's
  // graphs run one after another, and idle pools spinning on the cores the running graph needs
  // made spec rounds 2-3x slower than with spinning off (benchmarks/js_runtime.py, 2 cores)
  const sessionOptions: ortTypes.InferenceSession.SessionOptions = {
    graphOptimizationLevel: "all", executionMode: "sequential", logSeverityLevel: 3,
    extra: { session: { intra_op: { allow_spinning: "0" } } },
    ...options.sessionOptions,
  };
  // where onnxruntime cannot open files itself (browser, app assets), the graphs get the
  // files their initializers name as external data (the bundle's weights file; a feature
  // head's own besides): each read once, shared by every graph
  const external = new Map<string, Promise<Uint8Array>>();
  const open = async (role: string): Promise<GraphSession> => {
    const g = findGraph(manifest, role);
    progress(`opening ${g.file}`);
    // where onnxruntime-node copies every output back, the KV graphs return the new
    // positions only (graph.ts KVOutputs, onnx_edit.ts appendingOutputs)
    const holdsKV = g.inputs.some((t) => t.name.startsWith("past_key."));
    const kv = options.kvOutputs ?? (holdsKV && !(await outputsInPlace(ort)) ? "appended" : "bound");
    // a default export's attention takes query_seqlens, which onnxruntime's JavaScript
    // packages do not load: the graph is opened from bytes without it (onnx_edit.ts)
    const batched = g.inputs.some((t) => t.name === "query_seqlens");
    const appended = kv === "appended" && holdsKV;
    const graphBytes = async () => {
      let bytes = await files.readBytes(g.file);
      if (batched) bytes = withoutBatchedAttention(bytes, g.file);
      const input = g.inputs.some((t) => t.name === "hidden") ? "hidden" : "input_ids";
      return appended ? appendingOutputs(bytes, g.file, input) : bytes;
    };
    if (files.path) {
      if (!batched && !appended) return GraphSession.open(ort, files.path(g.file), g, modelInfo(manifest, g), sessionOptions, kv);
      // onnxruntime-node reads the weights file itself from the bundle's folder
      const extra = (sessionOptions.extra ?? {}) as Record<string, Record<string, unknown>>;
      const session = { ...extra.session, model_external_initializers_file_folder_path: files.path(".") };
      return GraphSession.open(ort, await graphBytes(), g, modelInfo(manifest, g), { ...sessionOptions, extra: { ...extra, session } }, kv);
    }
    const bytes = await graphBytes();
    const externalData = [];
    for (const path of externalFiles(bytes, g.file)) {
      if (!external.has(path)) {
        progress(`reading ${path}`);
        external.set(path, files.readBytes(path));
      }
      externalData.push({ path, data: await external.get(path)! });
    }
    return GraphSession.open(ort, bytes, g, modelInfo(manifest, g), { ...sessionOptions, externalData }, kv);
  };
  // a target steps as wide as the manifest says, or as this machine's kernels need
  const settled = async (stack: Stack) => {
    await settleStepWidth(stack, manifest.step_width);
    return stack;
  };
  let target: Stack, drafter: Drafter;
  if (mode === "self-spec") {
    const exits = exitLayers(manifest);
    const k = exitLayer ?? exits[exits.length - 1];
    if (k === undefined || !exits.includes(k)) {
      throw new InputError(
        exits.length
          ? `exit layer ${k} is not in this bundle (it has: ${exits.join(", ")})`
          : "self-spec needs exit layers: re-export with `edgespec export MODEL --exit-layers K`",
      );
    }
    const head = await open(`head@${k}`), tail = await open(`tail@${k}`);
    target = new Stack(ort, [head, tail]);
    drafter = new EarlyExitDrafter(target, new Map([[k, head]]), new Map([[k, tail]]), k);
  } else if (mode === "eagle") {
    findGraph(manifest, "eagle"); // a BundleError naming the fix if there is none
    target = new Stack(ort, [await open("full")]);
    const head = new EagleDrafter(target, await open("eagle"));
    drafter = options.drafter === "lookup+eagle" ? new Chain([new LookupDrafter(), head]) : head;
    policy = perSource(policy, drafter instanceof Chain ? drafter.drafters.map((d) => d.name) : [drafter.name]);
  } else if (mode === "split") {
    const has = manifest.graphs.some((g) => g.role === "draft");
    const kind = options.drafter ?? (has ? "draft" : "lookup");
    drafter = kind === "draft" ? new ModelDrafter(new Stack(ort, [await open("draft")])) : new LookupDrafter();
    const remote = new RemoteVerifier(options.split!, manifest.target.max_position_embeddings,
      manifest.backbone_fingerprint, kind === "draft" ? DEFAULT_SUPPORT.topK : null);
    // the bundle's own target finishes a generation whose link fails (FallbackVerifier)
    const local = options.split!.localFallback !== false && manifest.graphs.some((g) => g.role === "full")
      ? new LocalVerifier(await settled(new Stack(ort, [await open("full")]))) : null;
    const verifier = local ? new FallbackVerifier(remote, local) : remote;
    progress("reading the tokenizer");
    const tokenizer = await Tokenizer.fromBundle(files);
    const template = manifest.chat ? await ChatTemplate.fromBundle(files, manifest.chat) : null;
    return new Model(manifest, mode, tokenizer, template, verifier, drafter, policy);
  } else {
    target = new Stack(ort, [await open("full")]);
    if (mode === "spec") {
      const model = new ModelDrafter(new Stack(ort, [await open("draft")]));
      drafter = options.drafter === "lookup+draft" ? new Chain([new LookupDrafter(), model]) : model;
      policy = perSource(policy, drafter instanceof Chain ? drafter.drafters.map((d) => d.name) : [drafter.name]);
    } else {
      drafter = mode === "lookup" ? new LookupDrafter() : new NoDrafter();
    }
  }
  await settled(target);
  progress("reading the tokenizer");
  const tokenizer = await Tokenizer.fromBundle(files);
  const template = manifest.chat ? await ChatTemplate.fromBundle(files, manifest.chat) : null;
  return new Model(manifest, mode, tokenizer, template, new LocalVerifier(target), drafter, policy);
}

export class Model {
  private busy = false;
  // the token sequence whose positions the caches hold after the last chat turn (a prefix of
  // it stays valid: rounds truncate on rejection); empty after generate() or a failed turn
  private held: number[] = [];

  constructor(
    readonly manifest: Manifest,
    readonly mode: Mode,
    readonly tokenizer: Tokenizer,
    readonly template: ChatTemplate | null,
    readonly verifier: Verifier,
    readonly drafter: Drafter,
    readonly policy: DraftLengthPolicy,
  ) {}

  encode(prompt: Prompt): number[] {
    return promptIds(this.tokenizer, this.manifest, prompt);
  }

  /** The conversation as the model's prompt text, through the bundle's chat template. */
  renderChat(messages: Message[], options: RenderOptions = {}): string {
    if (!this.template) {
      throw new InputError("this bundle has no chat template: use generate() with a plain prompt");
    }
    return this.template.render(messages, options);
  }

  /** Text pieces as tokens are produced; the last chunk carries finishReason. */
  stream(prompt: Prompt, o: GenerateOptions = {}): AsyncGenerator<Chunk> {
    return this.run(this.encode(prompt), o, samplingParams(o), false);
  }

  private async *run(ids: number[], o: GenerateOptions, params: SamplingParams, keep: boolean): AsyncGenerator<Chunk> {
    const maxNew = o.maxNewTokens ?? 128;
    if (!(Number.isInteger(maxNew) && maxNew >= 1)) throw new InputError(`maxNewTokens must be an integer >= 1, got ${maxNew}`);
    if (this.busy) throw new InputError("this model is generating already: await that generation first (or load another)");
    this.busy = true;
    const cached = keep ? commonPrefix(this.held, ids) : 0;
    this.verifier.keepSession?.(keep); // a chat keeps the server's session between turns
    this.held = []; // until this turn ends cleanly, trust nothing in the caches
    const reply: number[] = [];
    let started = false;
    try {
      const stop = new Set(o.ignoreEos ? [] : this.manifest.eos_token_ids);
      const detok = this.tokenizer.streamDecoder(true);
      const steps = decode(this.verifier, this.drafter, this.policy, ids, params, maxNew, stop, cached, o.signal);
      for await (const step of steps) {
        started = true;
        reply.push(...step.tokens);
        // ids past the tokenizer's vocabulary (padded embedding rows) have no text
        let text = step.tokens.filter((t) => this.tokenizer.idToToken(t) !== undefined).map((t) => detok.push(t)).join("");
        if (step.finishReason) text += detok.flush();
        yield { text, tokens: step.tokens, stats: step.stats, finishReason: step.finishReason };
      }
    } finally {
      this.busy = false;
      // once prefilled, every cache holds a prefix of prompt + reply
      if (keep && started) this.held = [...ids, ...reply];
    }
  }

  /** Reply to a conversation ({role, content} messages) with the bundle's chat template;
   * consecutive calls keep the prefix the new prompt shares with the last turn's sequence in
   * the KV caches (target, draft model, lookup index) and prefill only the rest. */
  async chat(messages: Message[], o: ChatOptions = {}): Promise<ChatReply> {
    const ids = this.tokenizer.encode(this.renderChat(messages, o), false);
    if (!ids.length) throw new InputError("the conversation renders to no tokens: add a message with text");
    this.encode(ids); // the vocabulary and context checks
    const gen = this.manifest.chat?.generation ?? {};
    const sampled = Boolean(gen.do_sample);
    const params = samplingParams({
      temperature: o.temperature ?? (sampled ? Number(gen.temperature ?? 1) : 0),
      topP: o.topP ?? (sampled ? Number(gen.top_p ?? 1) : 1),
      topK: o.topK ?? (sampled ? Number(gen.top_k ?? 0) : 0),
      seed: o.seed,
    });
    const context = this.verifier.maxPositions;
    const maxNew = Math.min(o.maxNewTokens ?? 256, context - ids.length);
    const stats = new GenerationStats();
    const tokens: number[] = [];
    let finish = "length", cachedTokens = 0;
    for await (const chunk of this.run(ids, { ...o, maxNewTokens: maxNew }, params, true)) {
      if (chunk.stats.kind === "prefill") cachedTokens = ids.length - chunk.stats.positions;
      tokens.push(...chunk.tokens);
      stats.add(chunk.stats);
      finish = FINISH[chunk.finishReason ?? "length"] ?? finish;
    }
    const known = tokens.filter((t) => this.tokenizer.idToToken(t) !== undefined);
    return { text: this.tokenizer.decode(known, true), tokens, promptTokens: ids.length, cachedTokens, finishReason: finish, stats };
  }

  /** `stream()` run to the end: the text, tokens and stats. */
  async generate(prompt: Prompt, o: GenerateOptions = {}): Promise<Generation> {
    const promptTokens = this.encode(prompt);
    return collect(this.tokenizer, promptTokens, this.stream(promptTokens, o));
  }
}

/** A prompt's ids (text through the tokenizer, or the ids given), checked against the model's
 * vocabulary and context: an InputError names what is wrong and the fix. */
export function promptIds(tokenizer: Tokenizer, manifest: Manifest, prompt: Prompt): number[] {
  const ids = typeof prompt === "string" ? tokenizer.encode(prompt) : [...prompt];
  if (!ids.length) throw new InputError("the prompt is empty: give some text or at least one token id");
  const vocab = manifest.target.vocab_size;
  const bad = ids.find((i) => !(Number.isInteger(i) && i >= 0 && i < vocab));
  if (bad !== undefined) throw new InputError(`token id ${bad} is outside the vocabulary (0..${vocab - 1})`);
  const context = manifest.target.max_position_embeddings;
  if (ids.length >= context) {
    throw new InputError(
      `the prompt is ${ids.length} tokens but the model's context is ${context}: shorten it to at most ${context - 1} tokens`,
    );
  }
  return ids;
}

/** A stream run to the end: its text, tokens, finish reason and stats, as `generate` returns. */
export async function collect(
  tokenizer: Tokenizer, promptTokens: number[], chunks: AsyncGenerator<Chunk>,
): Promise<Generation> {
  const stats = new GenerationStats();
  const tokens: number[] = [];
  let finish = "length";
  for await (const chunk of chunks) {
    tokens.push(...chunk.tokens);
    stats.add(chunk.stats);
    finish = chunk.finishReason ?? finish;
  }
  const known = tokens.filter((t) => tokenizer.idToToken(t) !== undefined);
  return { text: tokenizer.decode(known, true), tokens, promptTokens, finishReason: finish, stats };
}
