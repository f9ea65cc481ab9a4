/** One bundle graph in an onnxruntime session, and a stack of graphs over one KV cache.

`GraphSession.run(cache, past, ids | hidden, keep)` processes S new positions after `past`
cached ones. The cache's buffers are passed both as `past_*` inputs and as preallocated
`present_*` outputs, so GroupQueryAttention writes the new keys/values in place, and rejecting
drafts is a length change (`KVCache.truncate`). onnxruntime-node 1.30/1.31 then copies every
output back into a new buffer, the cache's whole capacity included (~0.2 ms a MB: 2.2 ms of a
12 ms SmolLM2-135M step at 256 positions); where `outputsInPlace` finds it does, the graphs
return only the new positions instead ("appended": `onnx_edit.ts` `appendingOutputs`), copied
into buffers that grow a quarter at a time (`KVCache.reserve`: the attention then fills and
copies its own present at the cache's capacity, ~2.3 us a position of room on SmolLM2-135M). `Stack` is
`runtime/graphs/stack.py`: the stages of one model (`full`; `draft`; `head@k` then `tail@k`) over one
cache, with `forward(ids, keep)` -> logits of the last `keep` positions. A `full` graph that
declares the target's `features` output (`Manifest.feature_layers`) has them kept per cached
position (`Stack.features`, float32 [capacity, F]): written by `forward`, cut with the cache,
what a feature head drafts from (`EagleDrafter`, drafters.ts). */

import type * as ortTypes from "onnxruntime-common";
import { BundleError } from "./errors.js";
import { FEATURES, type GraphInfo, type ModelInfo } from "./bundle.js";

export type Ort = typeof ortTypes;
type Tensor = ortTypes.Tensor;

/** Positions a buffer holds past the cache's capacity: an exported graph runs a one-position
 * call's attention as two, whose copy's keys and values land there (`kv_cache.py` PAD_ROOM). */
export const PAD_ROOM = 1;

/** A growing cache (`KVCache.reserve`) starts with room for START_ROOM positions and grows by
 * GROWTH of its capacity (at least GROWTH_MIN positions): a step costs with the room a cache
 * has (at 520 cached positions, 1,040 of room cost ~1 ms a 17 ms step more than 560), and a
 * growth copies the cache once (~46 KB a position on SmolLM2-135M). */
export const START_ROOM = 64;
const GROWTH = 1.25, GROWTH_MIN = 32;

/** Outputs with a row per new position, whatever `num_logits_to_keep` says. */
const PER_POSITION = new Set(["hidden", FEATURES, "next_state"]);

/** KV buffers [1, kv_heads, capacity + PAD_ROOM, head_dim] per layer, plus one length
 * (`kv_cache.py`); `reserve` grows them up to `limit` (allocated at `limit` but where the
 * graphs append: `GraphSession.run`). */
export class KVCache {
  length = 0;
  limit: number;
  private room: { ort: Ort; layers: number[]; model: ModelInfo } | null = null;
  constructor(
    public buffers: Map<string, Tensor>, // "key.{i}" / "value.{i}" -> tensor over its buffer
    public capacity: number,
  ) {
    this.limit = capacity;
  }

  /** Positions per head in a buffer (its capacity and the pad's room). */
  get stride(): number {
    return this.capacity + PAD_ROOM;
  }

  /** Buffers for `capacity` positions that `reserve` grows up to `limit`. */
  static allocate(ort: Ort, layers: number[], m: ModelInfo, capacity: number, limit = capacity): KVCache {
    const buffers = new Map<string, Tensor>();
    const dims = [1, m.num_kv_heads, capacity + PAD_ROOM, m.head_dim];
    for (const i of layers) {
      for (const kind of ["key", "value"]) {
        const data = new Float32Array(m.num_kv_heads * (capacity + PAD_ROOM) * m.head_dim);
        buffers.set(`${kind}.${i}`, new ort.Tensor("float32", data, dims));
      }
    }
    const cache = new KVCache(buffers, capacity);
    cache.limit = Math.max(limit, capacity);
    cache.room = { ort, layers, model: m };
    return cache;
  }

  /** Room for `need` positions: past the capacity, buffers a quarter longer (GROWTH; at most
   * `limit`) replace these, the valid positions copied once. */
  reserve(need: number): void {
    if (need <= this.capacity) return;
    if (need > this.limit || !this.room) throw new RangeError(`KV cache full: ${need} positions > capacity ${this.limit}`);
    const { ort, layers, model } = this.room;
    const next = this.grown(ort, layers, model, Math.min(this.limit, Math.max(need, Math.ceil(GROWTH * this.capacity), this.capacity + GROWTH_MIN)));
    this.buffers = next.buffers;
    this.capacity = next.capacity;
  }

  /** A cache with room for `capacity` holding this one's valid positions (one copy). */
  grown(ort: Ort, layers: number[], m: ModelInfo, capacity: number): KVCache {
    const out = KVCache.allocate(ort, layers, m, capacity, Math.max(this.limit, capacity));
    const row = m.head_dim;
    for (const [name, src] of this.buffers) {
      const a = src.data as Float32Array, b = out.buffers.get(name)!.data as Float32Array;
      for (let h = 0; h < m.num_kv_heads; h++) {
        b.set(a.subarray(h * this.stride * row, (h * this.stride + this.length) * row), h * out.stride * row);
      }
    }
    out.length = this.length;
    return out;
  }

  truncate(length: number): void {
    if (!(length >= 0 && length <= this.length)) {
      throw new RangeError(`cannot truncate a cache of length ${this.length} to ${length}`);
    }
    this.length = length;
  }
}

/** How a binding returns the KV cache's `present_*` outputs: "bound" writes them into the
 * buffers passed as preallocated outputs and hands those back (`outputsInPlace`); "appended"
 * (onnxruntime-node 1.30/1.31, which copies each output, preallocated or not, into a new
 * buffer) runs graphs whose present outputs are the call's new positions only (`onnx_edit.ts`),
 * copied into the cache's buffers, which grow as needed; "returned" gives new tensors of the
 * cache's capacity (onnxruntime-web's wasm copies preallocated CPU outputs into its heap and never
 * back), which then replace the cache's buffers; "concatenated" (onnxruntime-web's WebGPU
 * attention) takes the past at its exact length and returns past + new positions, which are
 * copied back into the cache's buffers. */
export type KVOutputs = "bound" | "appended" | "returned" | "concatenated";

/** A Identity graph over 4 floats (ModelProto: ir_version 8, opset 13), for `outputsInPlace`. */
const PROBE = Uint8Array.of(
  8, 8, 58, 59, 10, 16, 10, 1, 120, 18, 1, 121, 34, 8, 73, 100, 101, 110, 116, 105, 116, 121,
  18, 5, 112, 114, 111, 98, 101, 90, 15, 10, 1, 120, 18, 10, 10, 8, 8, 1, 18, 4, 10, 2, 8, 4,
  98, 15, 10, 1, 121, 18, 10, 10, 8, 8, 1, 18, 4, 10, 2, 8, 4, 66, 4, 10, 0, 16, 13,
);

const inPlace = new WeakMap<object, Promise<boolean>>();

/** Whether this onnxruntime binding hands a preallocated output back in the caller's buffer
 * (onnxruntime PR #32346), found once per binding by running a 4-float Identity graph. */
export function outputsInPlace(ort: Ort): Promise<boolean> {
  let known = inPlace.get(ort);
  if (!known) {
    known = (async () => {
      const session = await ort.InferenceSession.create(PROBE);
      try {
        const x = new ort.Tensor("float32", Float32Array.of(1, 2, 3, 4), [4]);
        const y = new ort.Tensor("float32", new Float32Array(4), [4]);
        const out = await session.run({ x }, { y });
        const got = out.y.data as Float32Array, mine = y.data as Float32Array;
        return got.buffer === mine.buffer && got.byteOffset === mine.byteOffset && mine[3] === 4;
      } finally {
        await session.release();
      }
    })();
    inPlace.set(ort, known);
  }
  return known;
}

export interface Outputs {
  [name: string]: Tensor;
}

/** The feeds and fetches of "bound" calls on one cache, kept across calls: the scalar inputs
 * are tensors over arrays written in place, the KV entries never change (`GraphSession.run`). */
/** A call's new positions: [S] ids or [S, H] hidden states, and float32 inputs of S rows by
 * name (the eagle graph's `features` and `state`). */
export interface NewPositions {
  ids?: number[];
  hidden?: Float32Array;
  extra?: Record<string, Float32Array>;
}

interface BoundCall {
  cache: KVCache;
  buffers: Map<string, Tensor>; // the cache's buffers these entries were made from
  feeds: Record<string, Tensor>;
  fetches: Record<string, Tensor | null>;
  seqlens: Int32Array;
  total: Int32Array;
  keep: BigInt64Array;
  query: Int32Array;
}

export class GraphSession {
  readonly takesHidden: boolean;
  /** The graph reads `query_seqlens` (a default export's; its attention no longer takes it,
   * `onnx_edit.ts`): fed the call's width. */
  readonly takesQuery: boolean;
  readonly outputNames: string[];
  private call: BoundCall | null = null;
  private pending = false;

  constructor(
    readonly ort: Ort,
    readonly session: ortTypes.InferenceSession,
    readonly graph: GraphInfo,
    readonly model: ModelInfo,
    readonly kvOutputs: KVOutputs = "bound",
  ) {
    this.takesHidden = graph.inputs.some((t) => t.name === "hidden");
    this.takesQuery = graph.inputs.some((t) => t.name === "query_seqlens");
    this.outputNames = graph.outputs.map((t) => t.name).filter((n) => !n.startsWith("present_"));
  }

  static async open(ort: Ort, source: string | Uint8Array, graph: GraphInfo, model: ModelInfo,
    options: ortTypes.InferenceSession.SessionOptions, kvOutputs: KVOutputs = "bound"): Promise<GraphSession> {
    const kv = graph.inputs.find((t) => t.name.startsWith("past_key."));
    if (kv && kv.dtype !== "float32") {
      throw new BundleError(
        `${graph.file} keeps its KV cache in ${kv.dtype}; this JavaScript runtime runs float32 caches ` +
          "only so far: re-export with `--dtype fp32` (weights may still be quantized)",
      );
    }
    let session: ortTypes.InferenceSession;
    try {
      session = typeof source === "string"
        ? await ort.InferenceSession.create(source, options)
        : await ort.InferenceSession.create(source, options);
    } catch (e) {
      throw new BundleError(`onnxruntime cannot load ${graph.file}: ${(e as Error).message}; re-export the bundle`);
    }
    checkIO(session, graph);
    return new GraphSession(ort, session, graph, model, kvOutputs);
  }

  /** S new positions ([S] ids, or [S, H] hidden states) after `past` cached ones, written into
   * `cache` in place; the outputs (logits of the last `keep` positions). The caller owns the
   * cache length. */
  async run(cache: KVCache, past: number, input: NewPositions, keep: number): Promise<Outputs> {
    const ort = this.ort;
    const s = input.ids ? input.ids.length : input.hidden!.length / this.model.hidden_size;
    const total = past + s;
    const bound = this.kvOutputs === "bound", exact = this.kvOutputs === "concatenated";
    const appended = this.kvOutputs === "appended";
    if (appended) cache.reserve(total);
    if (total > cache.capacity) throw new RangeError(`KV cache full: ${total} positions > capacity ${cache.capacity}`);
    // (a second call while one is pending gets feeds of its own: the kept ones are shared)
    if ((bound || appended) && !this.pending) return this.runBound(cache, total, this.newPositions(input, s), keep, s);
    const feeds: Record<string, Tensor> = {
      seqlens_k: new ort.Tensor("int32", Int32Array.of(total - 1), [1]),
      total_seq_len: new ort.Tensor("int32", Int32Array.of(total), []),
      // onnxruntime-web's WebGPU kernels refuse empty tensors: a row no one reads, not none
      num_logits_to_keep: new ort.Tensor("int64", BigInt64Array.of(BigInt(exact && keep === 0 ? 1 : keep)), []),
    };
    if (this.takesQuery) feeds.query_seqlens = new ort.Tensor("int32", Int32Array.of(s), [1]);
    for (const [name, tensor] of this.newPositions(input, s)) feeds[name] = tensor;
    const fetches: Record<string, Tensor | null> = {};
    for (const name of this.outputNames) fetches[name] = null;
    for (const i of this.graph.kv_layers) {
      for (const kind of ["key", "value"]) {
        const buffer = cache.buffers.get(`${kind}.${i}`)!;
        feeds[`past_${kind}.${i}`] = exact ? this.positions(buffer, cache.stride, past) : buffer;
        fetches[`present_${kind}.${i}`] = bound ? buffer : null; // bound: the same memory, written in place
      }
    }
    const out = (await this.session.run(feeds, fetches)) as Outputs;
    if (appended) {
      this.append(out, cache, past, s);
    } else if (exact) {
      if (keep === 0) {
        for (const name of this.outputNames) {
          const t = out[name];
          // (outputs of every position stay: hidden states, features, a head's next state)
          if (!PER_POSITION.has(name)) out[name] = new ort.Tensor("float32", new Float32Array(0), [1, 0, t.dims[2]]);
        }
      }
      for (const i of this.graph.kv_layers) {
        for (const kind of ["key", "value"]) {
          const present = out[`present_${kind}.${i}`];
          // total, or total + 1 where the graph padded a one-position call (PAD_ROOM)
          const held = present.dims[2];
          if (held !== total && held !== total + PAD_ROOM) {
            throw new Error(`present_${kind}.${i} came back with ${held} positions, not ${total}`);
          }
          this.store(present.data as Float32Array, held, Math.min(held, cache.stride), cache.buffers.get(`${kind}.${i}`)!, cache.stride);
        }
      }
    } else if (!bound) {
      // GroupQueryAttention's present holds the past and the new positions at the same
      // capacity: it becomes the cache's buffer
      for (const i of this.graph.kv_layers) {
        for (const kind of ["key", "value"]) {
          const present = out[`present_${kind}.${i}`];
          if (present.dims[2] !== cache.stride) {
            throw new Error(`present_${kind}.${i} came back with ${present.dims[2]} positions, not the cache's ${cache.stride}`);
          }
          cache.buffers.set(`${kind}.${i}`, present);
        }
      }
    }
    return out;
  }

  private newPositions(input: NewPositions, s: number): [string, Tensor][] {
    const out: [string, Tensor][] = [this.takesHidden
      ? ["hidden", new this.ort.Tensor("float32", input.hidden!, [1, s, this.model.hidden_size])]
      : ["input_ids", new this.ort.Tensor("int64", BigInt64Array.from(input.ids!, BigInt), [1, s])]];
    for (const [name, data] of Object.entries(input.extra ?? {})) {
      out.push([name, new this.ort.Tensor("float32", data, [1, s, data.length / s])]);
    }
    return out;
  }

  /** A "bound" call: the cache's buffers are both past and preallocated present, written in
   * place; an "appended" one: they are the past, and the new positions come back (`append`).
   * The feeds and fetches are built once per cache and reused (building ~40 named entries per
   * call cost a small graph's step more than a tenth of its time). */
  private async runBound(cache: KVCache, total: number, inputs: [string, Tensor][], keep: number, s: number): Promise<Outputs> {
    let c = this.call;
    if (!c || c.cache !== cache || c.buffers !== cache.buffers) {
      const ort = this.ort;
      const seqlens = new Int32Array(1), totalLen = new Int32Array(1), keeps = new BigInt64Array(1);
      const feeds: Record<string, Tensor> = {
        seqlens_k: new ort.Tensor("int32", seqlens, [1]),
        total_seq_len: new ort.Tensor("int32", totalLen, []),
        num_logits_to_keep: new ort.Tensor("int64", keeps, []),
      };
      const query = new Int32Array(1);
      if (this.takesQuery) feeds.query_seqlens = new ort.Tensor("int32", query, [1]);
      const fetches: Record<string, Tensor | null> = {};
      for (const n of this.outputNames) fetches[n] = null;
      for (const i of this.graph.kv_layers) {
        for (const kind of ["key", "value"]) {
          const buffer = cache.buffers.get(`${kind}.${i}`)!;
          feeds[`past_${kind}.${i}`] = buffer;
          // bound: the same memory, written in place
          fetches[`present_${kind}.${i}`] = this.kvOutputs === "bound" ? buffer : null;
        }
      }
      c = this.call = { cache, buffers: cache.buffers, feeds, fetches, seqlens, total: totalLen, keep: keeps, query };
    }
    c.seqlens[0] = total - 1;
    c.total[0] = total;
    c.keep[0] = BigInt(keep);
    c.query[0] = s;
    for (const [name, tensor] of inputs) c.feeds[name] = tensor;
    this.pending = true;
    let out: Outputs;
    try {
      out = (await this.session.run(c.feeds, c.fetches)) as Outputs;
    } finally {
      this.pending = false;
    }
    if (this.kvOutputs === "appended") this.append(out, cache, total - s, s);
    return out;
  }

  /** An "appended" call's new positions ([1, heads, s, dim] per `present_*`) written into
   * the cache's buffers after `past`. */
  private append(out: Outputs, cache: KVCache, past: number, s: number): void {
    const row = this.model.head_dim, stride = cache.stride, heads = this.model.num_kv_heads;
    for (const i of this.graph.kv_layers) {
      for (const kind of ["key", "value"]) {
        const present = out[`present_${kind}.${i}`];
        if (present.dims[2] !== s) throw new Error(`present_${kind}.${i} came back with ${present.dims[2]} positions, not the call's ${s}`);
        const src = present.data as Float32Array, dst = cache.buffers.get(`${kind}.${i}`)!.data as Float32Array;
        for (let h = 0; h < heads; h++) dst.set(src.subarray(h * s * row, (h + 1) * s * row), (h * stride + past) * row);
      }
    }
  }

  /** The first `n` positions of a [1, heads, capacity, dim] buffer as a [1, heads, n, dim] tensor. */
  private positions(buffer: Tensor, capacity: number, n: number): Tensor {
    const m = this.model, row = m.head_dim, src = buffer.data as Float32Array;
    const data = new Float32Array(m.num_kv_heads * n * row);
    for (let h = 0; h < m.num_kv_heads; h++) data.set(src.subarray(h * capacity * row, (h * capacity + n) * row), h * n * row);
    return new this.ort.Tensor("float32", data, [1, m.num_kv_heads, n, row]);
  }

  /** The first `n` of [1, heads, held, dim] positions written into the front of a buffer of
   * `stride` positions per head. */
  private store(data: Float32Array, held: number, n: number, buffer: Tensor, stride: number): void {
    const row = this.model.head_dim, dst = buffer.data as Float32Array;
    for (let h = 0; h < this.model.num_kv_heads; h++) dst.set(data.subarray(h * held * row, (h * held + n) * row), h * stride * row);
  }
}

function checkIO(session: ortTypes.InferenceSession, graph: GraphInfo): void {
  for (const [kind, real, declared] of [
    ["inputs", session.inputNames, graph.inputs],
    ["outputs", session.outputNames, graph.outputs],
  ] as const) {
    const got = new Set(real), want = new Set(declared.map((t) => t.name));
    const diff = [...got].filter((n) => !want.has(n)).concat([...want].filter((n) => !got.has(n)));
    if (diff.length) {
      throw new BundleError(
        `${graph.file}'s ${kind} do not match manifest.json (differences: ${diff.slice(0, 6).join(", ")}); ` +
          "the graph file and the manifest come from different exports — re-export the bundle",
      );
    }
  }
}

/** Rows of a [rows, vocab] logits tensor, as views. */
export function rows(t: Tensor): Float32Array[] {
  const data = t.data as Float32Array;
  const vocab = t.dims[t.dims.length - 1];
  const n = data.length / vocab;
  return Array.from({ length: n }, (_, r) => data.subarray(r * vocab, (r + 1) * vocab));
}

export class Stack {
  cache: KVCache | null = null;
  readonly model: ModelInfo;
  readonly layers: number[];
  readonly maxPositions: number;
  /** The target's features per position (0: its graph declares none). */
  readonly featureWidth: number;
  /** [rows, featureWidth] float32: the rows below `length` are the target's at those positions. */
  features = new Float32Array(0);
  /** Every call runs a multiple of this many positions (`padCall`; the manifest's
   * `step_width`, set on a target by `settleStepWidth`). */
  stepWidth = 1;

  constructor(readonly ort: Ort, readonly stages: GraphSession[], readonly logits = "logits") {
    this.model = stages[stages.length - 1].model;
    this.layers = [...new Set(stages.flatMap((s) => s.graph.kv_layers))].sort((a, b) => a - b);
    this.maxPositions = this.model.max_position_embeddings;
    const outputs = stages.length === 1 ? stages[0].graph.outputs : [];
    const f = outputs.find((t) => t.name === FEATURES);
    this.featureWidth = f ? Number(f.shape[f.shape.length - 1]) : 0;
  }

  get length(): number {
    return this.cache ? this.cache.length : 0;
  }

  /** The stages append the new positions to buffers that grow (`KVOutputs`). */
  get grows(): boolean {
    return this.stages.every((s) => s.kvOutputs === "appended");
  }

  reset(capacity: number): void {
    capacity += this.stepWidth - 1; // room for a pad (`padCall`)
    // a cache kept from a much longer generation is replaced: a step costs with the capacity
    // (onnxruntime-node's copy of each output; the attention's copy of the past)
    if (this.cache && this.cache.limit >= capacity && this.cache.capacity <= 2 * capacity) {
      this.cache.truncate(0);
    } else {
      this.cache = KVCache.allocate(this.ort, this.layers, this.model, this.grows ? Math.min(capacity, START_ROOM) : capacity, capacity);
    }
    this.featureRoom(this.cache.limit, 0);
  }

  /** Feature rows for `capacity` positions, the first `keep` kept. */
  private featureRoom(capacity: number, keep: number): void {
    const w = this.featureWidth;
    if (!w || this.features.length >= capacity * w) return;
    const grown = new Float32Array(capacity * w);
    grown.set(this.features.subarray(0, keep * w));
    this.features = grown;
  }

  /** Keep the first `keep` cached positions with room for `capacity`; how many were kept. */
  resume(capacity: number, keep: number): number {
    if (keep <= 0 || !this.cache || this.cache.length === 0) {
      this.reset(capacity);
      return 0;
    }
    keep = Math.min(keep, this.cache.length);
    this.cache.truncate(keep);
    capacity += this.stepWidth - 1;
    if (this.grows) {
      this.cache.limit = Math.max(this.cache.limit, capacity);
    } else if (this.cache.capacity < capacity) {
      const room = Math.min(Math.max(capacity, 2 * this.cache.capacity), this.maxPositions);
      this.cache = this.cache.grown(this.ort, this.layers, this.model, Math.max(room, capacity));
    }
    this.featureRoom(this.cache.limit, keep);
    return keep;
  }

  /** Logits rows [keep][vocab] for new ids, appended to the cache. */
  async forward(ids: number[], keep = 1): Promise<Float32Array[]> {
    const cache = this.cache;
    if (!cache) throw new Error("call reset() first");
    const [pad, kept, wanted] = padCall(ids.length, keep, this.stepWidth);
    let input: NewPositions = { ids: pad ? [...ids, ...Array(pad).fill(ids[ids.length - 1])] : ids };
    let out: Outputs = {};
    for (const stage of this.stages) {
      const last = stage === this.stages[this.stages.length - 1];
      out = await stage.run(cache, cache.length, input, last ? kept : 0);
      if (!last) input = { hidden: out.hidden.data as Float32Array };
    }
    if (this.featureWidth) {
      const w = this.featureWidth, f = out[FEATURES].data as Float32Array;
      this.features.set(f.subarray(0, ids.length * w), cache.length * w);
    }
    cache.length += ids.length;
    return rows(out[this.logits]).slice(...wanted);
  }

  /** Logits for hidden states [S, H] a head already computed (its layers' KV are in the
   * cache beyond `length`); advances the length by S. */
  async forwardTail(tail: GraphSession, hidden: Float32Array, keep: number): Promise<Float32Array[]> {
    const cache = this.cache!, h = this.model.hidden_size, n = hidden.length / h;
    const [pad, kept, wanted] = padCall(n, keep, this.stepWidth);
    let fed = hidden;
    if (pad) {
      fed = new Float32Array((n + pad) * h);
      fed.set(hidden);
      for (let i = 0; i < pad; i++) fed.set(hidden.subarray((n - 1) * h), (n + i) * h);
    }
    const out = await tail.run(cache, cache.length, { hidden: fed }, kept);
    cache.length += n;
    return rows(out.logits).slice(...wanted);
  }

  truncate(length: number): void {
    if (this.cache) this.cache.truncate(Math.min(length, this.cache.length));
  }
}

/** A call of `width` new positions keeping the last `keep` logits rows, at `stepWidth`
 * (`stack.py` `pad_call`): [copies of the last input appended, rows the padded call keeps,
 * the [start, end) of those rows that are the asked-for ones]. */
export function padCall(width: number, keep: number, stepWidth: number): [number, number, [number, number]] {
  const pad = (stepWidth - (width % stepWidth)) % stepWidth;
  const need = keep ? keep + pad : 0; // the last rows of the padded call, the wanted ones in
  const kept = Math.min(need + ((stepWidth - (need % stepWidth)) % stepWidth), width + pad);
  return [pad, kept, [kept - need, kept - pad]];
}

/** A target's `stepWidth`: the manifest's, or 2 where it is 1 but on this machine the rows of
 * one-position calls are not the same bits as the same positions inside one wider call
 * (`stack.py` `settle_step_width`: five probe positions, each stepped alone against one
 * 3-wide call after the same two). */
export async function settleStepWidth(stack: Stack, declared: number): Promise<void> {
  stack.stepWidth = declared;
  if (declared !== 1) return;
  const vocab = stack.model.vocab_size, ids = [1, 2, 3, 4, 5].map((i) => i % vocab);
  stack.reset(ids.length);
  await stack.forward(ids.slice(0, 2));
  const alone: Float32Array[] = [];
  for (let i = 2; i < 5; i++) alone.push((await stack.forward(ids.slice(i, i + 1)))[0]);
  stack.reset(ids.length);
  await stack.forward(ids.slice(0, 2));
  const wide = await stack.forward(ids.slice(2), 3);
  stack.cache = null;
  const same = (a: Float32Array, b: Float32Array) => a.length === b.length && a.every((x, j) => x === b[j]);
  if (!alone.every((a, i) => same(a, wide[i]))) stack.stepWidth = 2;
}
