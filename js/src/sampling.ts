/** Logits -> the next token (`runtime/sampling.py`): greedy, or temperature / top-k / top-p.

`probabilities` is the target distribution every mode reproduces; speculative sampling
compares draft and target probabilities computed by this same function. The random stream
is this package's own (xoshiro128**, seeded): a seed fixes a JavaScript generation, and the
distribution is the Python runtime's, but the draws are not numpy's. */

import { InputError } from "./errors.js";
import { PCG64 } from "./random.js";

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

/** The random stream: numpy's default_rng(seed) (see random.ts); no seed, a random one. */
export class Rng extends PCG64 {
  constructor(seed: number | null) {
    super(seed ?? Math.floor(Math.random() * 2 ** 32));
  }
}

/** numpy's sum of a float64 array (pairwise, blocks of 8 up to 128): the same float, so a
 * distribution normalized here is the Python runtime's to the last bit. */
export function pairwiseSum(a: Float64Array, lo = 0, n = a.length): number {
  if (n < 8) {
    let res = -0;
    for (let i = lo; i < lo + n; i++) res += a[i];
    return res;
  }
  if (n <= 128) {
    const r = [a[lo], a[lo + 1], a[lo + 2], a[lo + 3], a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]];
    let i = 8;
    for (; i < n - (n % 8); i += 8) for (let j = 0; j < 8; j++) r[j] += a[lo + i + j];
    let res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; i++) res += a[lo + i];
    return res;
  }
  let n2 = Math.floor(n / 2);
  n2 -= n2 % 8;
  return pairwiseSum(a, lo, n2) + pairwiseSum(a, lo + n2, n - n2);
}

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
  for (let i = 0; i < n; i++) z[i] = Math.exp(z[i] - max);
  const sum = pairwiseSum(z);
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
    for (let i = 0; i < n; i++) if (!keep[i]) z[i] = 0;
    const kept = pairwiseSum(z);
    for (let i = 0; i < n; i++) z[i] /= kept;
  }
  return z;
}

/** Inverse-CDF draw from p (unnormalized is fine): one uniform per token, as numpy's
 * searchsorted(cumsum(p), u * sum(p), side="right"). */
export function sample(p: Float64Array, rng: Rng): number {
  const u = rng.random() * pairwiseSum(p);
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
