/** Logits -> the next token (`runtime/sampling.py`): greedy, or temperature / top-k / top-p.

`probabilities` is the target distribution every mode reproduces; speculative sampling
compares draft and target probabilities computed by this same function. The random stream
is this package's own (xoshiro128**, seeded): a seed fixes a JavaScript generation, and the
distribution is the Python runtime's, but the draws are not numpy's. */

import { InputError } from "./errors.js";

export interface SamplingParams {
  temperature: number; // 0 = greedy
  topP: number;
  topK: number; // 0 = off
  seed: number | null;
}

export function samplingParams(o: Partial<SamplingParams> = {}): SamplingParams {
  const p = { temperature: o.temperature ?? 0, topP: o.topP ?? 1, topK: o.topK ?? 0, seed: o.seed ?? null };
  if (!(p.temperature >= 0)) throw new InputError(`temperature must be >= 0 (0 = greedy), got ${p.temperature}`);
  if (!(p.topP > 0 && p.topP <= 1)) throw new InputError(`topP must be in (0, 1], got ${p.topP}`);
  if (!(Number.isInteger(p.topK) && p.topK >= 0)) throw new InputError(`topK must be an integer >= 0 (0 = off), got ${p.topK}`);
  return p;
}

export const isGreedy = (p: SamplingParams): boolean => p.temperature === 0;

/** A seeded uniform generator on [0, 1) (xoshiro128**, 53-bit doubles). */
export class Rng {
  private s: Uint32Array;
  constructor(seed: number | null) {
    let x = (seed ?? Math.floor(Math.random() * 2 ** 32)) >>> 0;
    this.s = new Uint32Array(4);
    for (let i = 0; i < 4; i++) { // splitmix32 fills the state
      x = (x + 0x9e3779b9) >>> 0;
      let z = x;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
      this.s[i] = (z ^ (z >>> 16)) >>> 0;
    }
  }
  private next32(): number {
    const s = this.s;
    const r = Math.imul(rotl(Math.imul(s[1], 5) >>> 0, 7), 9) >>> 0;
    const t = (s[1] << 9) >>> 0;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = rotl(s[3], 11);
    return r;
  }
  random(): number {
    return ((this.next32() >>> 5) * 67108864 + (this.next32() >>> 6)) / 9007199254740992;
  }
}

const rotl = (x: number, k: number): number => ((x << k) | (x >>> (32 - k))) >>> 0;

export function argmax(row: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < row.length; i++) if (row[i] > row[best]) best = i;
  return best;
}

/** The sampling distribution (float64, sums to 1) over the vocab for one logits row. */
export function probabilities(logits: Float32Array, p: SamplingParams): Float64Array {
  const n = logits.length;
  const z = new Float64Array(n);
  for (let i = 0; i < n; i++) z[i] = logits[i] / p.temperature;
  if (p.topK && p.topK < n) {
    const kth = Float64Array.from(z).sort()[n - p.topK];
    for (let i = 0; i < n; i++) if (z[i] < kth) z[i] = -Infinity;
  }
  let max = -Infinity;
  for (let i = 0; i < n; i++) if (z[i] > max) max = z[i];
  let sum = 0;
  for (let i = 0; i < n; i++) sum += (z[i] = Math.exp(z[i] - max));
  for (let i = 0; i < n; i++) z[i] /= sum;
  if (p.topP < 1) {
    const order = Array.from({ length: n }, (_, i) => i).sort((a, b) => z[b] - z[a] || a - b);
    let cumulative = 0, cut = n;
    for (let j = 0; j < n; j++) {
      cumulative += z[order[j]];
      if (cumulative >= p.topP) { cut = j + 1; break; } // smallest prefix reaching topP
    }
    const keep = new Uint8Array(n);
    for (let j = 0; j < cut; j++) keep[order[j]] = 1;
    let kept = 0;
    for (let i = 0; i < n; i++) kept += keep[i] ? z[i] : (z[i] = 0);
    for (let i = 0; i < n; i++) z[i] /= kept;
  }
  return z;
}

/** Inverse-CDF draw from p (unnormalized is fine): one uniform per token. */
export function sample(p: Float64Array, rng: Rng): number {
  let total = 0;
  for (let i = 0; i < p.length; i++) total += p[i];
  const u = rng.random() * total;
  let cdf = 0;
  for (let i = 0; i < p.length; i++) {
    cdf += p[i];
    if (u < cdf) return i;
  }
  return p.length - 1;
}

export function nextToken(logits: Float32Array, p: SamplingParams, rng: Rng): number {
  return isGreedy(p) ? argmax(logits) : sample(probabilities(logits, p), rng);
}
