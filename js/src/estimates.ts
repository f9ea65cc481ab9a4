/** What a round drafting γ tokens is expected to yield and to cost, learned online
(`runtime/policies/estimates.py`, ported line for line): the estimators `auto` and `acceptance`
maximise N(γ) / T(γ) with.

  AcceptanceModel   N(γ), expected tokens of a round, from per-position acceptance (counted
                    apart after a round accepted whole and after one cut short)
  CostModel         T(γ) = γ·t_draft + a verify-plus-overhead line a + b·γ corrected per γ,
                    and the γ with the most expected tokens per second
The constants are `Priors` (why each is what it is: docs/tuning.md). Calibration seeding is
not ported: a JavaScript model starts from the priors. */

import type { RoundStats } from "./round.js";

export const MAX_DRAFT = 12;

export interface Priors {
  acceptance: number; acceptanceDecay: number; shrink: number; statePrior: number;
  statePriorFirst: number; timeDecay: number; fitDecay: number; ridge: number; slow: number;
  tablePrior: number; warmRounds: number; coldDecay: number; probeGap: number;
  maxProbeGap: number; clearlyLosing: number; carriedRounds: number;
}

export const PRIORS: Priors = {
  acceptance: 0.6, acceptanceDecay: 0.04, shrink: 5.0, statePrior: 8.0, statePriorFirst: 2.0,
  timeDecay: 0.15, fitDecay: 0.03, ridge: 2.0, slow: 1.5, tablePrior: 4.0, warmRounds: 16,
  coldDecay: 0.2, probeGap: 4, maxProbeGap: 128, clearlyLosing: 0.9, carriedRounds: 8.0,
};

type Counts = [number[], number[]]; // (drafts reached, drafts accepted) per position 1..MAX_DRAFT
const counts = (): Counts => [new Array(MAX_DRAFT + 1).fill(0), new Array(MAX_DRAFT + 1).fill(0)];
const ewma = (old: number, fresh: number, decay: number): number => old + decay * (fresh - old);
const sum = (xs: number[]): number => xs.reduce((a, b) => a + b, 0); // Python's sum: in order

export class AcceptanceModel {
  afterFull = false;
  private all = counts();
  private after = new Map<boolean, Counts>([[true, counts()], [false, counts()]]);
  constructor(readonly priors: Priors = PRIORS) {}

  /** A new generation: keep at most `rounds` rounds' weight of what was measured (its text
   * may be unlike the last one's), and no run going on. */
  carry(rounds: number): void {
    for (const [reached, passed] of [this.all, ...this.after.values()]) {
      if (reached[1] > rounds) {
        const scale = rounds / reached[1];
        for (let k = 0; k < reached.length; k++) {
          reached[k] *= scale;
          passed[k] *= scale;
        }
      }
    }
    this.afterFull = false;
  }

  observe(drafted: number, accepted: number): void {
    drafted = Math.min(drafted, MAX_DRAFT);
    accepted = Math.min(accepted, drafted, MAX_DRAFT);
    if (drafted <= 0) return;
    const keep = 1 - this.priors.acceptanceDecay;
    const tried = Math.min(accepted + 1, drafted);
    for (const [reached, passed] of [this.all, this.after.get(this.afterFull)!]) {
      for (let k = 1; k <= MAX_DRAFT; k++) {
        reached[k] = reached[k] * keep + (k <= tried ? 1 : 0);
        passed[k] = passed[k] * keep + (k <= accepted ? 1 : 0);
      }
    }
    this.afterFull = accepted === drafted;
  }

  expected(gamma: number, pooled = false): number {
    return this.curve(gamma, pooled)[gamma];
  }

  /** [N(0), N(1), .., N(longest)]. */
  curve(longest: number, pooled = false): number[] {
    const [reached, passed] = this.all;
    const [reachedS, passedS] = pooled ? this.all : this.after.get(this.afterFull)!;
    const p = this.priors;
    const overall = (sum(passed) + 2 * p.acceptance) / (sum(reached) + 2);
    let survive = 1.0;
    const tokens = [1.0];
    for (let k = 1; k <= longest; k++) {
      if (k <= MAX_DRAFT) {
        const h = (passed[k] + p.shrink * overall) / (reached[k] + p.shrink);
        const prior = k === 1 ? p.statePriorFirst : p.statePrior;
        survive *= (passedS[k] + prior * h) / (reachedS[k] + prior);
      }
      tokens.push(tokens[tokens.length - 1] + survive);
    }
    return tokens;
  }
}

export class CostModel {
  tDraft: number | null = null;
  readonly roundTime = new Map<number, number>(); // γ -> EWMA seconds (insertion-ordered)
  rounds = 0;
  private sums = [0, 0, 0, 0, 0]; // Σw, Σwγ, Σwr, Σwγ², Σwγr
  private seen = new Map<number, number>();
  private table = new Map<number, [number, number]>();
  private drafting: [number, number] = [0, 0];
  private warm = new Set<number>();
  private cold = new Map<number, number>();
  readonly acceptance: AcceptanceModel;

  constructor(readonly priors: Priors = PRIORS) {
    this.acceptance = new AcceptanceModel(priors);
  }

  observe(s: RoundStats): void {
    const p = this.priors;
    this.rounds += 1;
    this.age();
    let draft = s.draftSeconds;
    const g = s.drafted;
    let seconds = s.seconds - s.catchupSeconds;
    if (s.index > 0 && s.index <= p.warmRounds) {
      if (this.warm.has(g)) {
        const slow = Math.min(Math.max(seconds / this.cost(g), 1 / 3), 3.0);
        this.cold.set(s.index, ewma(this.cold.get(s.index) ?? slow, slow, p.coldDecay));
      }
      const factor = this.cold.get(s.index) ?? 1.0;
      seconds /= factor;
      draft /= factor;
    } else {
      this.warm.add(g);
    }
    if (s.drafted) draft = this.learnDrafting(s.drafted, s.accepted, draft);
    if (this.roundTime.size) seconds = Math.min(seconds, p.slow * this.cost(g));
    const n = (this.seen.get(g) ?? 0) + 1;
    this.seen.set(g, n);
    const old = this.roundTime.get(g);
    const weight = Math.max(p.timeDecay, 1 / n);
    this.roundTime.set(g, old === undefined ? seconds : ewma(old, seconds, weight));
    if (g > 0) this.fit(g, seconds - Math.min(draft, seconds));
  }

  private learnDrafting(drafted: number, accepted: number, seconds: number): number {
    this.acceptance.observe(drafted, accepted);
    if (this.tDraft !== null) seconds = Math.min(seconds, this.priors.slow * drafted * this.tDraft);
    this.drafting = [this.drafting[0] + seconds, this.drafting[1] + drafted];
    this.tDraft = this.drafting[0] / this.drafting[1];
    return seconds;
  }

  expected(gamma: number): number {
    return this.acceptance.expected(gamma);
  }

  private age(): void {
    const keep = 1 - this.priors.fitDecay;
    this.sums = this.sums.map((v) => v * keep);
    for (const [g, [w, total]] of this.table) this.table.set(g, [w * keep, total * keep]);
    this.drafting = [this.drafting[0] * keep, this.drafting[1] * keep];
  }

  private fit(gamma: number, seconds: number, weight = 1.0): void {
    const [tw, total] = this.table.get(gamma) ?? [0, 0];
    this.table.set(gamma, [tw + weight, total + weight * seconds]);
    const [w, x, y, xx, xy] = this.sums;
    this.sums = [w + weight, x + weight * gamma, y + weight * seconds, xx + weight * gamma * gamma, xy + weight * gamma * seconds];
  }

  private line(): [number, number] | null {
    const [w, x, y, xx, xy] = this.sums;
    if (w <= 0) return null;
    const meanG = x / w, meanT = y / w;
    const spread = Math.max(xx - x * meanG, 0.0);
    const slope = Math.max((xy - x * meanT) / (spread + this.priors.ridge), 0.0);
    return [meanT - slope * meanG, slope];
  }

  cost(gamma: number): number {
    return this.costWith(gamma, this.line());
  }

  private costWith(gamma: number, line: [number, number] | null): number {
    if (gamma === 0 && this.roundTime.has(0)) return this.roundTime.get(0)!;
    const draft = gamma * (this.tDraft ?? 0.0);
    if (line !== null) {
      const [w, total] = this.table.get(gamma) ?? [0, 0];
      const prior = this.priors.tablePrior;
      const rest = (total + prior * (line[0] + line[1] * gamma)) / (w + prior);
      return Math.max(draft + rest, 1e-9);
    }
    const first = this.roundTime.values().next();
    return Math.max(draft + (first.done ? 0.0 : first.value), 1e-9);
  }

  rate(gamma: number): number {
    return this.expected(gamma) / this.cost(gamma);
  }

  /** (γ, expected tokens per second) maximising N(γ) / T(γ). */
  bestLength(maxLength: number, minLength = 1): [number, number] {
    if (this.tDraft === null || !this.roundTime.size) return [Math.min(4, maxLength), 0.0];
    const tokens = this.acceptance.curve(maxLength);
    const line = this.line();
    let best: [number, number] = [minLength, -1.0];
    for (let g = minLength; g <= maxLength; g++) {
      const rate = tokens[g] / this.costWith(g, line);
      if (rate > best[1]) best = [g, rate];
    }
    return best;
  }
}
