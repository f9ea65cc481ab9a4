/** The local verifier (`runtime/verify/local.py`): the bundle's own target graphs (`full`, or
`head@k` + `tail@k`). Scores [last, d_1..d_γ] in one forward (or, for drafts an early-exit
head made, only tail@k over the hidden states it computed), then applies the acceptance rule;
the decode loop truncates the cache to the accepted prefix through `truncate`. */

import { accept } from "./accept.js";
import type { Stack } from "./graph.js";
import { nextToken, type Rng, type SamplingParams } from "./sampling.js";
import { now, roundStats, type Proposal, type RoundStats, type Verdict, type Verifier } from "./round.js";

export class LocalVerifier implements Verifier {
  readonly maxPositions: number;
  constructor(readonly target: Stack) {
    this.maxPositions = target.maxPositions;
  }

  async prefill(prompt: number[], capacity: number, params: SamplingParams, rng: Rng, cached: number): Promise<[number, RoundStats]> {
    const start = now();
    // keep the cached prefix; at least the last prompt token is processed: its logits start decoding
    const kept = this.target.resume(capacity, Math.min(cached, prompt.length - 1));
    const logits = await this.target.forward(prompt.slice(kept), 1);
    const token = nextToken(logits[logits.length - 1], params, rng);
    const seconds = now() - start;
    return [token, roundStats("prefill", 1, prompt.length - kept, seconds, { verifySeconds: seconds })];
  }

  maxDrafts(seq: number[]): number {
    return this.target.maxPositions - seq.length;
  }

  async submit(seq: number[], p: Proposal, params: SamplingParams, rng: Rng): Promise<Verdict> {
    const start = now();
    const g = p.tokens.length;
    const logits = p.tail
      ? await this.target.forwardTail(p.tail.tail, p.tail.hidden, g + 1)
      : await this.target.forward([seq[seq.length - 1], ...p.tokens], g + 1);
    const [n, token] = accept(p.tokens, p.q, logits, params, rng);
    return { accepted: n, token, verifySeconds: now() - start + (p.tail?.headSeconds ?? 0) };
  }

  truncate(length: number): void {
    this.target.truncate(length);
  }
}
