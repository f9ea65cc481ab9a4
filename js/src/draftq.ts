/** Draft distributions (`runtime/draft_q.py`, `sparse_q.py`): what a sampling drafter samples
from and the acceptance rule checks. The drafter's tempered distribution is cut to its top
`DraftSupport.topK` ids (then the user's top-k / top-p) and quantized to integer counts summing
to SCALE; q(x) = count(x) / SCALE exactly, and `SparseQ.sample` draws from exactly it. Any q
the draft was truly sampled from keeps speculative sampling lossless; building it as Python
does (same ids, counts and draws) keeps the two runtimes' sampled outputs equal. */

import type { Rng, SamplingParams } from "./sampling.js";
import { pairwiseSum } from "./sampling.js";

export const SCALE = 65535; // counts are u16 on the wire

export interface DraftSupport {
  topK: number; // at most this many ids (0: no cap)
  topP: number;
}

export const DEFAULT_SUPPORT: DraftSupport = { topK: 128, topP: 1 };

export class SparseQ {
  constructor(readonly ids: Int32Array, readonly counts: Int32Array) {}

  prob(token: number): number {
    const i = this.ids.indexOf(token);
    return i < 0 ? 0 : this.counts[i] / SCALE;
  }

  /** A draw from exactly this distribution (numpy: searchsorted(cumsum(counts), u, "right")). */
  sample(rng: Rng): number {
    const u = rng.integers(SCALE);
    let cdf = 0;
    for (let i = 0; i < this.counts.length; i++) {
      cdf += this.counts[i];
      if (u < cdf) return this.ids[i];
    }
    return this.ids[this.ids.length - 1];
  }
}

/** Indices of the k largest values, largest first (ties: lower index first). One pass that
 * keeps the k best so far in order: a value enters only past the k-th best, which after the
 * first few thousand ids few do (sorting a 49,152-id vocabulary took ~20 ms, a draft step
 * of SmolLM2's several times over). */
export function topIds(values: Float32Array, k: number): number[] {
  k = Math.min(k, values.length);
  if (k <= 0) return [];
  const ids = new Int32Array(k), best = new Float64Array(k);
  let n = 0;
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (n === k && !(v > best[k - 1])) continue; // not above the k-th best (ties: it came later)
    let at = n < k ? n++ : k - 1;
    while (at > 0 && v > best[at - 1]) { // after every equal value: lower ids first
      best[at] = best[at - 1];
      ids[at] = ids[at - 1];
      at--;
    }
    best[at] = v;
    ids[at] = i;
  }
  return Array.from(ids.subarray(0, n));
}

/** Counts summing to SCALE, proportional to w over ids (largest remainder); zero counts dropped. */
export function quantize(ids: number[], w: Float64Array): SparseQ {
  const total = pairwiseSum(w);
  const exact = Array.from(w, (x) => (x / total) * SCALE);
  const counts = exact.map(Math.floor);
  const short = SCALE - counts.reduce((a, b) => a + b, 0);
  if (short) {
    const order = counts.map((_, i) => i).sort((a, b) => (counts[a] - exact[a]) - (counts[b] - exact[b]) || a - b);
    for (const i of order.slice(0, short)) counts[i] += 1;
  }
  const keep = counts.map((c, i) => (c > 0 ? i : -1)).filter((i) => i >= 0);
  return new SparseQ(Int32Array.from(keep, (i) => ids[i]), Int32Array.from(keep, (i) => counts[i]));
}

/** (the distribution to draft from, the drafter's confidence: its top probability). */
export function fromLogits(logits: Float32Array, params: SamplingParams, support = DEFAULT_SUPPORT): [SparseQ, number] {
  const vocab = logits.length;
  let k = Math.min(support.topK || vocab, vocab, SCALE);
  if (params.topK) k = Math.min(k, params.topK);
  let ids = topIds(logits, k);
  const top = logits[ids[0]];
  let w = Float64Array.from(ids, (i) => Math.exp((logits[i] - top) / params.temperature));
  let total: number;
  if (params.topK && params.topK <= k) {
    total = pairwiseSum(w); // the user's top-k is the whole support
  } else {
    // the tempered mass of the whole vocabulary (float32 terms, as the Python runtime)
    const kept = params.topK ? topIds(logits, params.topK).map((i) => logits[i]) : Array.from(logits);
    const inv = Math.fround(1 / params.temperature);
    const e = Float64Array.from(kept, (x) => Math.fround(Math.exp(Math.fround(Math.fround(x - top) * inv))));
    total = pairwiseSum(e);
  }
  const confidence = w[0] / total;
  if (params.topP < 1) { // the user's top-p, over the user's distribution
    let cum = 0, cut = ids.length;
    for (let j = 0; j < ids.length; j++) {
      cum += w[j];
      if (cum / total >= params.topP) { cut = j + 1; break; }
    }
    ids = ids.slice(0, cut);
    w = w.slice(0, cut);
  }
  if (support.topP < 1) {
    const sum = pairwiseSum(w);
    let cum = 0, cut = ids.length;
    for (let j = 0; j < ids.length; j++) {
      cum += w[j];
      if (cum / sum >= support.topP) { cut = j + 1; break; }
    }
    ids = ids.slice(0, cut);
    w = w.slice(0, cut);
  }
  return [quantize(ids, w), confidence];
}
