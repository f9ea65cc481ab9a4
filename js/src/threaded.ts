/** A model whose graphs run in a worker thread (Node), behind `Model`'s API.

onnxruntime-node 1.30's `InferenceSession.run` computes synchronously inside a `setImmediate`
callback, so a model on the app's thread holds its event loop for a whole step (a long prefill:
seconds). `ThreadedModel` loads the bundle in a `node:worker_threads` worker (`worker.ts`) and
keeps only the tokenizer and chat template here: `stream()` yields the rounds the worker posts
(one message per round, not per step), `generate()` and `chat()` gather them, and an
`AbortSignal` is relayed through shared memory, so the worker stops before its next round; chunks already posted
after the abort are dropped here and the stream ends with `AbortError` as `Model`'s does.
`close()` ends the thread; an idle worker never keeps the process alive. */

import { Worker } from "node:worker_threads";
import type { Manifest } from "./bundle.js";
import { ChatTemplate, ChatTemplateError, type Message, type RenderOptions } from "./chat.js";
import { AbortError, BundleError, EdgespecError, InputError } from "./errors.js";
import type { BundleFiles } from "./files.js";
import { loadManifest } from "./bundle.js";
import {
  type ChatOptions, type ChatReply, type Chunk, type GenerateOptions, type Generation, type LoadOptions,
  type Mode, type Prompt, collect, promptIds, resolveMode,
} from "./model.js";
import { GenerationStats } from "./round.js";
import { Tokenizer } from "./tokenizer.js";
import { LinkError, SplitError } from "./remote.js";

type Reply =
  | { type: "loaded" }
  | { type: "progress"; message: string }
  | { type: "chunk"; id: number; chunk: Chunk }
  | { type: "done"; id: number; result?: ChatReply }
  | { type: "error"; id: number; error: { name: string; message: string } };

const KINDS: Record<string, new (message: string) => Error> = {
  EdgespecError, BundleError, InputError, AbortError, ChatTemplateError, LinkError, SplitError,
  RangeError, TypeError,
};

/** The worker's error as the class the app's thread would have thrown. */
function revive(e: { name: string; message: string }): Error {
  const Kind = KINDS[e.name] ?? Error;
  const error = new Kind(e.message);
  if (!KINDS[e.name]) error.name = e.name;
  return error;
}

/** Replies of one call, awaited in order. */
class Inbox {
  private items: Reply[] = [];
  private waiting: ((r: Reply) => void) | null = null;

  put(r: Reply): void {
    if (this.waiting) {
      const w = this.waiting;
      this.waiting = null;
      w(r);
    } else this.items.push(r);
  }

  next(): Promise<Reply> {
    const r = this.items.shift();
    return r ? Promise.resolve(r) : new Promise((resolve) => (this.waiting = resolve));
  }
}

/** The options a call sends the worker: everything but the signal (relayed as messages). */
function plain<T extends { signal?: AbortSignal }>(o: T): Omit<T, "signal"> {
  const { signal: _, ...rest } = o;
  return rest;
}

export class ThreadedModel {
  private calls = new Map<number, Inbox>();
  private nextId = 1;
  private closed = false;
  /** Of the last aborted call: the rounds that reached this thread after its signal fired
   * (the round in flight then, and any the app had not read yet), dropped unread. */
  roundsAfterAbort = 0;

  private constructor(
    private readonly worker: Worker,
    readonly manifest: Manifest,
    readonly mode: Mode,
    readonly tokenizer: Tokenizer,
    readonly template: ChatTemplate | null,
  ) {
    worker.on("message", (r: Reply) => {
      if (r.type !== "loaded" && r.type !== "progress") this.calls.get(r.id)?.put(r);
    });
    worker.on("error", (e) => this.fail(e));
    worker.on("exit", () => this.fail(new EdgespecError("the model's worker thread exited: load the bundle again")));
    worker.unref();
  }

  /** Loads `files` (the folder `dir`) in a new worker thread with `options` (no split mode:
   * its WebSocket stays on the app's thread, `load()` keeps that mode there). */
  static async open(dir: string, files: BundleFiles, options: LoadOptions): Promise<ThreadedModel> {
    const { onProgress, ...rest } = options;
    const worker = new Worker(new URL("./worker.js", import.meta.url));
    const loaded = new Promise<void>((resolve, reject) => {
      const done = () => {
        worker.off("message", onMessage);
        worker.off("error", reject);
        worker.off("exit", onExit);
      };
      const onMessage = (r: Reply) => {
        if (r.type === "progress") onProgress?.(r.message);
        else if (r.type === "loaded" || r.type === "error") {
          done();
          if (r.type === "loaded") resolve();
          else reject(revive(r.error));
        }
      };
      const onExit = (code: number) => {
        done();
        reject(new EdgespecError(`the model's worker thread exited (code ${code}) while loading ${dir}`));
      };
      worker.on("message", onMessage);
      worker.on("error", reject);
      worker.on("exit", onExit);
    });
    worker.postMessage({ type: "load", dir, options: rest });
    try {
      // the tokenizer and template load here meanwhile (encode and renderChat stay synchronous);
      // every part settles first, so a bad bundle is refused for its first fault in this order
      // (the manifest, the tokenizer, the worker's graphs) however the loads race
      const parts = await Promise.allSettled([loadManifest(files), Tokenizer.fromBundle(files), loaded]);
      for (const part of parts) if (part.status === "rejected") throw part.reason;
      const manifest = (parts[0] as PromiseFulfilledResult<Manifest>).value;
      const tokenizer = (parts[1] as PromiseFulfilledResult<Tokenizer>).value;
      const template = manifest.chat ? await ChatTemplate.fromBundle(files, manifest.chat) : null;
      return new ThreadedModel(worker, manifest, resolveMode(manifest, options).mode, tokenizer, template);
    } catch (e) {
      await worker.terminate();
      throw e;
    }
  }

  /** `Model.encode`: the prompt's ids, checked against the vocabulary and the context. */
  encode(prompt: Prompt): number[] {
    return promptIds(this.tokenizer, this.manifest, prompt);
  }

  renderChat(messages: Message[], options: RenderOptions = {}): string {
    if (!this.template) throw new InputError("this bundle has no chat template: use generate() with a plain prompt");
    return this.template.render(messages, options);
  }

  stream(prompt: Prompt, o: GenerateOptions = {}): AsyncGenerator<Chunk> {
    return this.call({ type: "stream", ids: this.encode(prompt), options: plain(o) }, o.signal) as AsyncGenerator<Chunk>;
  }

  async generate(prompt: Prompt, o: GenerateOptions = {}): Promise<Generation> {
    const promptTokens = this.encode(prompt);
    return collect(this.tokenizer, promptTokens, this.stream(promptTokens, o));
  }

  async chat(messages: Message[], o: ChatOptions = {}): Promise<ChatReply> {
    const calls = this.call({ type: "chat", messages, options: plain(o) }, o.signal);
    let r = await calls.next();
    while (!r.done) r = await calls.next();
    const reply = r.value as ChatReply;
    return { ...reply, stats: Object.assign(new GenerationStats(), reply.stats) };
  }

  /** Ends the worker thread (its sessions with it); the model cannot generate afterwards. */
  async close(): Promise<void> {
    this.closed = true;
    await this.worker.terminate();
  }

  private fail(e: Error): void {
    for (const [id, inbox] of this.calls) inbox.put({ type: "error", id, error: { name: e.name, message: e.message } });
  }

  private async *call(request: Record<string, unknown>, signal?: AbortSignal): AsyncGenerator<Chunk, ChatReply | undefined> {
    if (this.closed) throw new EdgespecError("this model was closed: load the bundle again");
    const id = this.nextId++, inbox = new Inbox();
    this.calls.set(id, inbox);
    this.worker.ref(); // a generation in flight keeps the process alive
    const flag = new Int32Array(new SharedArrayBuffer(4)); // read by the worker's decode loop
    const abort = () => Atomics.store(flag, 0, 1);
    signal?.addEventListener("abort", abort, { once: true });
    if (signal?.aborted) abort();
    this.worker.postMessage({ ...request, id, abort: flag.buffer });
    let ended = false, late = 0;
    try {
      for (;;) {
        const r = await inbox.next();
        if (r.type === "chunk") {
          if (signal?.aborted) late += 1;
          if (signal?.aborted) throw new AbortError("the generation was aborted (its AbortSignal fired)");
          yield r.chunk;
        } else if (r.type === "done") {
          ended = true;
          return r.result;
        } else if (r.type === "error") {
          ended = true;
          throw revive(r.error);
        }
      }
    } finally {
      signal?.removeEventListener("abort", abort);
      if (!ended) {
        // the consumer left early (break, or the abort above): stop the worker's generation
        // and wait for its end, so the next call finds the model free
        abort();
        for (let r = await inbox.next(); r.type === "chunk"; r = await inbox.next()) late += 1;
      }
      if (signal?.aborted) this.roundsAfterAbort = late;
      this.calls.delete(id);
      if (!this.calls.size) this.worker.unref();
    }
  }
}
