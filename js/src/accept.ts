/** The acceptance rules of speculative decoding (`runtime/verify/accept.py`).

Given drafts d_1..d_γ and the target's logits rows for [last, d_1..d_γ]:
  greedy    the longest prefix the target's argmax agrees with, then its argmax;
  sampling  d_i kept with probability min(1, p(d_i)/q(d_i)); on the first rejection a token
            from norm(max(0, p - q)); all kept: a bonus token from p.
q is the distribution each draft was drawn from, or null for a deterministic drafter (prompt
lookup: a point mass on d_i). Greedy output equals the target's own greedy output; sampled
output follows the target's distribution (Leviathan et al. 2023; Chen et al. 2023). */

import { argmax, isGreedy, probabilities, sample, type Rng, type SamplingParams } from "./sampling.js";

import { SCALE, type SparseQ } from "./draftq.js";

/** The distribution a draft was drawn from (see draftq.ts). */
export type DraftQ = SparseQ;

export function acceptGreedy(tokens: number[], logits: Float32Array[]): [number, number] {
  let n = 0;
  while (n < tokens.length && argmax(logits[n]) === tokens[n]) n++;
  return [n, argmax(logits[n])];
}

export function acceptSampled(
  tokens: number[], q: DraftQ[] | null, logits: Float32Array[], params: SamplingParams, rng: Rng,
): [number, number] {
  for (let i = 0; i < tokens.length; i++) {
    const d = tokens[i];
    const p = probabilities(logits[i], params);
    const qd = q === null ? 1 : q[i].prob(d);
    if (rng.random() * qd < p[d]) continue; // u < p/q without dividing by a zero q
    if (q === null) p[d] = 0;
    else q[i].ids.forEach((x, j) => (p[x] = Math.max(p[x] - q[i].counts[j] / SCALE, 0)));
    return [i, sample(p, rng)];
  }
  return [tokens.length, sample(probabilities(logits[tokens.length], params), rng)];
}

export function accept(
  tokens: number[], q: DraftQ[] | null, logits: Float32Array[], params: SamplingParams, rng: Rng,
): [number, number] {
  return isGreedy(params) ? acceptGreedy(tokens, logits) : acceptSampled(tokens, q, logits, params, rng);
}
