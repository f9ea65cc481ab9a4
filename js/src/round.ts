/** The contracts of one speculative round (`runtime/round.py`): what the policy plans, what a
drafter proposes, what a verifier answers; and the round's stats (`runtime/stats.py`).

  Plan      γ (at most this many drafts) and the exit layer to draft from
  Proposal  the drafts and how they were made: "greedy" (the drafter's argmax), "sampled"
            (drawn from the rows in `q`) or "point" (prompt lookup); `tail` carries the
            hidden states an early-exit head computed, for a verifier that runs only tail@k
  Drafter   begin / source(seq) / propose(seq, plan) / commit: told how many tokens to propose
  Verifier  prefill / submit -> Verdict / truncate
Drafters and verifiers never consult the policy: the decode loop asks it once per round. */

import type { DraftQ } from "./accept.js";
import type { GraphSession } from "./graph.js";
import type { Rng, SamplingParams } from "./sampling.js";

export interface Plan {
  length: number;
  exitLayer: number | null;
  minConfidence: number; // stop drafting after a token drafted below this probability
}

export const capped = (plan: Plan, length: number): Plan =>
  ({ ...plan, length: Math.max(0, Math.min(plan.length, length)) });

export interface TailInput {
  hidden: Float32Array; // the head's hidden states of [last, d_1..d_γ]
  tail: GraphSession;
  exitLayer: number;
  headSeconds: number;
}

export interface Proposal {
  tokens: number[];
  kind: "greedy" | "sampled" | "point";
  q: DraftQ[] | null;
  seconds: number;
  tail: TailInput | null;
  catchupSeconds?: number; // feeding tokens the drafter had skipped (not in `seconds`)
}

export const emptyProposal = (seconds = 0): Proposal =>
  ({ tokens: [], kind: "point", q: null, seconds, tail: null });

export interface Drafter {
  readonly name: string;
  begin(prompt: number[], capacity: number, cached: number): Promise<void>;
  source(seq: number[]): string | null;
  propose(seq: number[], plan: Plan, params: SamplingParams, rng: Rng): Promise<Proposal>;
  commit(valid: number): void;
}

export interface Verdict {
  accepted: number;
  token: number;
  verifySeconds: number;
}

export interface Verifier {
  readonly maxPositions: number;
  prefill(prompt: number[], capacity: number, params: SamplingParams, rng: Rng, cached: number): Promise<[number, RoundStats]>;
  maxDrafts(seq: number[]): number;
  submit(seq: number[], proposal: Proposal, params: SamplingParams, rng: Rng): Promise<Verdict>;
  truncate(length: number): void;
  /** The generation is over (a remote verifier ends or pauses its server session). */
  close?(): void;
  /** Whether the next generation may resume this one's state (a remote session). */
  keepSession?(keep: boolean): void;
}

export interface RoundStats {
  kind: "prefill" | "decode";
  tokens: number; // produced this round
  positions: number; // fed to the verifier
  seconds: number;
  drafted: number;
  accepted: number;
  draftSeconds: number;
  verifySeconds: number;
  source: string | null;
  exitLayer: number | null;
  index: number; // the round's place in its generation (1, 2, ..; 0: prefill)
  catchupSeconds: number; // feeding tokens a drafter had skipped: a one-off, not drafting
}

export function roundStats(kind: RoundStats["kind"], tokens: number, positions: number, seconds: number,
  more: Partial<RoundStats> = {}): RoundStats {
  return {
    kind, tokens, positions, seconds, drafted: 0, accepted: 0, draftSeconds: 0, verifySeconds: 0,
    source: null, exitLayer: null, index: 0, catchupSeconds: 0, ...more,
  };
}

/** One round's yield: the tokens it produced and its stats; the last carries finishReason. */
export interface Step {
  tokens: number[];
  stats: RoundStats;
  finishReason: string | null;
}

/** The sums over a generation (`GenerationStats`). */
export class GenerationStats {
  rounds = 0;
  drafted = 0;
  accepted = 0;
  tokens = 0;
  prefillSeconds = 0;
  decodeSeconds = 0;
  draftSeconds = 0;
  verifySeconds = 0;
  acceptedHistogram: number[] = [];

  add(s: RoundStats): void {
    this.tokens += s.tokens;
    if (s.kind === "prefill") {
      this.prefillSeconds += s.seconds;
      return;
    }
    this.rounds += 1;
    this.drafted += s.drafted;
    this.accepted += s.accepted;
    this.decodeSeconds += s.seconds;
    this.draftSeconds += s.draftSeconds;
    this.verifySeconds += s.verifySeconds;
    if (s.drafted) {
      while (this.acceptedHistogram.length <= s.accepted) this.acceptedHistogram.push(0);
      this.acceptedHistogram[s.accepted] += 1;
    }
  }

  get acceptanceRate(): number {
    return this.drafted ? this.accepted / this.drafted : 0;
  }

  /** Tokens per second after the first token (the decode phase). */
  get decodeTokensPerSecond(): number {
    return this.decodeSeconds ? (this.tokens - 1) / this.decodeSeconds : 0;
  }
}

export const now = (): number => performance.now() / 1000;
