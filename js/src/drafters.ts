/** Drafters (`runtime/drafters/base.py`): where proposed tokens come from. Each is told how many.

  NoDrafter          proposes nothing: plain autoregressive decoding
  ModelDrafter       a drafting model on its own KV cache: the bundle's `draft` graph
  EarlyExitDrafter   the target's first k layers (head@k) with the shared LM head, writing into
                     the target's own cache, so verification runs only tail@k (KV reuse)
  LookupDrafter      model-free: continues an n-gram of the recent text where it occurred before
  EagleDrafter       a feature head (EAGLE style, the bundle's `eagle` graph made by `edgespec
                     distill`): drafts from the target's own features on a KV cache of its own
  Chain              drafters tried in order (`lookup+eagle`): the first that proposes wins

A drafter sees the committed sequence and feeds itself whatever it has not processed yet, so
it stays in step however many tokens the last round accepted. */

import type { DraftQ } from "./accept.js";
import { KVCache, rows, START_ROOM, type GraphSession, type Outputs, type Stack } from "./graph.js";
import { InputError } from "./errors.js";
import { fromLogits } from "./draftq.js";
import { argmax, isGreedy, pairwiseSum, type Rng, type SamplingParams } from "./sampling.js";
import { capped, emptyProposal, now, type Drafter, type Plan, type Proposal } from "./round.js";

/** Run a drafting model one token at a time: `step(feed)` -> next-token logits. Returns the
 * drafts, their q when sampling, and the last feed (not processed yet). */
async function draftTokens(
  step: (ids: number[]) => Promise<Float32Array>, feed: number[], plan: Plan, params: SamplingParams, rng: Rng,
): Promise<[number[], DraftQ[], number[]]> {
  const tokens: number[] = [];
  const qs: DraftQ[] = [];
  while (tokens.length < plan.length) {
    const logits = await step(feed);
    let d: number, confidence = 1;
    if (isGreedy(params)) {
      d = argmax(logits);
      // the softmax is skipped unless a confidence stop reads it (it costs a vocabulary pass)
      if (plan.minConfidence > 0) confidence = greedyConfidence(logits, d);
    } else {
      const [q, c] = fromLogits(logits, params);
      d = q.sample(rng);
      qs.push(q);
      confidence = c;
    }
    tokens.push(d);
    feed = [d];
    if (confidence < plan.minConfidence) break;
  }
  return [tokens, qs, feed];
}

/** The drafter's top probability: 1 / sum(exp(logits - logits[d])), in float64. */
function greedyConfidence(logits: Float32Array, d: number): number {
  const e = Float64Array.from(logits, (x) => Math.exp(x - logits[d]));
  return 1 / pairwiseSum(e);
}

function proposal(tokens: number[], qs: DraftQ[], params: SamplingParams, seconds: number): Proposal {
  const greedy = isGreedy(params);
  return { tokens, kind: greedy ? "greedy" : "sampled", q: greedy ? null : qs, seconds, tail: null };
}

export class NoDrafter implements Drafter {
  readonly name = "none";
  async begin(): Promise<void> {}
  source(): string | null {
    return null;
  }
  async propose(): Promise<Proposal> {
    return emptyProposal();
  }
  commit(): void {}
}

export class ModelDrafter implements Drafter {
  readonly name = "draft";
  constructor(readonly model: Stack) {}

  source(): string | null {
    return this.name;
  }

  async begin(prompt: number[], capacity: number, cached: number): Promise<void> {
    const kept = this.model.resume(Math.min(capacity, this.model.maxPositions), cached);
    if (kept < prompt.length) await this.model.forward(prompt.slice(kept), 0);
  }

  async propose(seq: number[], plan: Plan, params: SamplingParams, rng: Rng): Promise<Proposal> {
    const start = now();
    plan = capped(plan, this.model.maxPositions - seq.length);
    let feed = seq.slice(this.model.length);
    // after a round that accepted all its drafts the model has seen neither d_γ nor the
    // target's token: both go into the first step; a longer feed is a stretch of plain
    // steps, fed in a call of its own and timed apart (a one-off the policies must not price)
    let catchup = 0;
    if (plan.length > 0 && feed.length > 2) {
      const t = now();
      await this.model.forward(feed.slice(0, -1), 0);
      feed = feed.slice(-1);
      catchup = now() - t;
    }
    const step = async (ids: number[]) => (await this.model.forward(ids, 1))[0];
    const [tokens, qs] = await draftTokens(step, feed, plan, params, rng);
    const p = proposal(tokens, qs, params, now() - start - catchup);
    p.catchupSeconds = catchup;
    return p;
  }

  commit(valid: number): void {
    this.model.truncate(valid);
  }
}

export class EarlyExitDrafter implements Drafter {
  readonly name = "exit";
  constructor(
    readonly target: Stack,
    readonly heads: Map<number, GraphSession>,
    readonly tails: Map<number, GraphSession>,
    readonly exitLayer: number,
  ) {}

  async begin(): Promise<void> {} // the target's prefill already filled the head's layers

  source(): string | null {
    return this.name;
  }

  async propose(seq: number[], plan: Plan, params: SamplingParams, rng: Rng): Promise<Proposal> {
    const start = now();
    const k = plan.exitLayer ?? this.exitLayer;
    const head = this.heads.get(k)!, cache = this.target.cache!;
    let past = this.target.length;
    const hidden: Float32Array[] = [];
    const runHead = async (ids: number[], keep = 1): Promise<Float32Array> => {
      const out = await head.run(cache, past, { ids }, keep);
      hidden.push(out.hidden.data as Float32Array);
      past += ids.length;
      const logits = out.exit_logits.data as Float32Array;
      return keep ? logits.subarray(logits.length - head.model.vocab_size) : logits;
    };
    const [tokens, qs, last] = await draftTokens(runHead, seq.slice(past), plan, params, rng);
    const drafting = now() - start;
    // the last token's hidden state: the tail verifies it too (part of verifying, not drafting)
    await runHead(last, 0);
    const size = hidden.reduce((n, h) => n + h.length, 0);
    const all = new Float32Array(size);
    let at = 0;
    for (const h of hidden) { all.set(h, at); at += h.length; }
    const p = proposal(tokens, qs, params, drafting);
    p.tail = { hidden: all, tail: this.tails.get(k)!, exitLayer: k, headSeconds: now() - start - drafting };
    return p;
  }

  commit(): void {} // the head's layers live in the target's cache, which the round truncated
}

export class LookupDrafter implements Drafter {
  readonly name = "lookup";
  private lastEnd = new Map<string, number>();
  private indexed = 0;
  constructor(readonly maxNgram = 3, readonly minNgram = 2) {}

  async begin(_prompt: number[], _capacity: number, cached: number): Promise<void> {
    if (cached < this.indexed) {
      this.lastEnd = new Map();
      this.indexed = 0;
    }
  }

  source(seq: number[]): string | null {
    return this.match(seq) !== null ? this.name : null;
  }

  async propose(seq: number[], plan: Plan): Promise<Proposal> {
    const start = now();
    const end = this.match(seq);
    if (end !== null && plan.length > 0) {
      const tokens = seq.slice(end + 1, end + 1 + plan.length);
      return { tokens, kind: "point", q: null, seconds: now() - start, tail: null };
    }
    return emptyProposal(now() - start);
  }

  /** Where the longest recent n-gram last ended before, or null. */
  private match(seq: number[]): number | null {
    this.index(seq, seq.length - 1); // n-grams ending before the current last token
    for (let n = this.maxNgram; n >= this.minNgram; n--) {
      if (seq.length <= n) continue;
      const end = this.lastEnd.get(seq.slice(-n).join(","));
      if (end !== undefined) return end;
    }
    return null;
  }

  private index(seq: number[], upto: number): void {
    for (let end = this.indexed; end < upto; end++) {
      for (let n = this.minNgram; n <= this.maxNgram; n++) {
        if (end + 1 >= n) this.lastEnd.set(seq.slice(end + 1 - n, end + 1).join(","), end);
      }
    }
    this.indexed = Math.max(this.indexed, upto);
  }

  commit(): void {}
}

/** The feature-head drafter (`runtime/drafters/eagle.py`): the bundle's `eagle` graph drafting a
chain from the target's own features (`Stack.features`, which the target's `full` graph declares
and the stack keeps per cached position). Head position p reads the target's features at p and
the embedding of token p + 1, and predicts token p + 2; it keeps a KV cache of its own, one
layer. The graph scores the head's draft vocabulary and lays the logits on the target's ids
(-inf where no draft id maps), so drafts are target ids.

Authoritative state, after a round that kept n of γ drafts (the sequence is L tokens; the
target holds L - 1 positions and their features):
  `exact`   head positions 0..exact-1 were computed from the target's features and committed
            tokens: the only ones kept. Drafting writes positions past them from the head's
            own states (`next_state`); `commit` drops those, so the next round recomputes them
            from the target's features (at most n + 1 positions, one call), and its first draft
            comes from the target's features at the last kept position
  draft k   position L - 3 + k; k = 1 reads the target's features at L - 2 (the bonus token
            has none yet: it is position L - 1's token, the head's input there), k > 1 the
            head's own state of the position before
The target verifies every draft: greedy output is the target's, sampling follows the target's
distribution (the drafts' q is what they were drawn from). */
export class EagleDrafter implements Drafter {
  readonly name = "eagle";
  private cache: KVCache | null = null;
  private exact = 0; // head positions computed from the target's features (see above)
  readonly hidden: number;
  readonly maxPositions: number;

  constructor(readonly target: Stack, readonly head: GraphSession) {
    if (!target.featureWidth) {
      throw new InputError(
        "the eagle drafter reads the target's features: this bundle's full graph declares none; " +
          "make the bundle with `edgespec distill`",
      );
    }
    this.hidden = head.model.hidden_size;
    this.maxPositions = head.model.max_position_embeddings;
  }

  source(): string | null {
    return this.name;
  }

  async begin(_prompt: number[], capacity: number, cached: number): Promise<void> {
    // position p needs token p + 1: the cached prefix keeps positions below cached - 1
    this.exact = Math.min(this.exact, Math.max(cached - 1, 0));
    const room = capacity + 1;
    const layers = this.head.graph.kv_layers, m = this.head.model;
    if (this.cache && this.head.kvOutputs === "appended") {
      this.cache.limit = Math.max(this.cache.limit, room); // it grows as it fills (graph.ts)
    } else if (this.head.kvOutputs === "appended") {
      this.cache = KVCache.allocate(this.target.ort, layers, m, Math.min(room, START_ROOM), room);
    } else if (!this.cache || this.cache.capacity < room) {
      const old = this.cache;
      if (old && this.exact) {
        old.length = this.exact;
        this.cache = old.grown(this.target.ort, layers, m, room);
      } else {
        this.cache = KVCache.allocate(this.target.ort, layers, m, room);
      }
    }
    this.cache.length = this.exact;
  }

  async propose(seq: number[], plan: Plan, params: SamplingParams, rng: Rng): Promise<Proposal> {
    const start = now();
    plan = capped(plan, this.maxPositions - seq.length);
    if (plan.length === 0) return emptyProposal();
    const cache = this.cache;
    if (!cache) throw new Error("call begin() first");
    const known = this.target.length; // positions with the target's features: seq.length - 1
    cache.length = this.exact;
    const width = this.target.featureWidth, hidden = this.hidden;
    let state = new Float32Array(hidden);
    const run = async (ids: number[], features: Float32Array, before: Float32Array): Promise<Float32Array> => {
      const out: Outputs = await this.head.run(cache, cache.length, { ids, extra: { features, state: before } }, 1);
      cache.length += ids.length;
      const next = out.next_state.data as Float32Array;
      state = next.slice(next.length - hidden); // the last position's: the next step's state
      const r = rows(out.logits);
      return r[r.length - 1];
    };
    // feed ids (the tokens of the next head positions); the last one's logits
    const step = async (ids: number[]): Promise<Float32Array> => {
      const p = cache.length;
      const exact = Math.max(0, Math.min(ids.length, known - p)); // positions with the target's features
      let logits: Float32Array | null = null;
      if (exact) {
        const features = this.target.features.slice(p * width, (p + exact) * width);
        logits = await run(ids.slice(0, exact), features, new Float32Array(exact * hidden));
        this.exact = cache.length;
      }
      for (const t of ids.slice(exact)) logits = await run([t], new Float32Array(width), state); // the head's own state
      return logits!;
    };
    const [tokens, qs] = await draftTokens(step, seq.slice(this.exact + 1), plan, params, rng);
    return proposal(tokens, qs, params, now() - start);
  }

  commit(valid: number): void {
    // the positions drafted from the head's own states are dropped (see above)
    this.exact = Math.min(this.exact, Math.max(valid - 1, 0), this.target.length);
    if (this.cache) this.cache.length = this.exact;
  }
}

/** Drafters in order (`lookup+eagle`): the first non-empty proposal is the round's. */
export class Chain implements Drafter {
  readonly name: string;
  constructor(readonly drafters: Drafter[]) {
    this.name = drafters.map((d) => d.name).join("+");
  }

  async begin(prompt: number[], capacity: number, cached: number): Promise<void> {
    for (const d of this.drafters) await d.begin(prompt, capacity, cached);
  }

  source(seq: number[]): string | null {
    for (const d of this.drafters) {
      const s = d.source(seq);
      if (s !== null) return s;
    }
    return null;
  }

  async propose(seq: number[], plan: Plan, params: SamplingParams, rng: Rng): Promise<Proposal> {
    let seconds = 0;
    let p = emptyProposal();
    for (const d of this.drafters) {
      p = await d.propose(seq, plan, params, rng);
      p.seconds += seconds; // the drafters that found nothing cost time too
      if (p.tokens.length) break;
      seconds = p.seconds;
    }
    return p;
  }

  commit(valid: number): void {
    for (const d of this.drafters) d.commit(valid);
  }
}
