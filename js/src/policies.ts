/** Draft-length policies (`runtime/policies/draft_length.py`): a policy plans each round (γ, exit layer,
confidence stop) and observes the round's stats. `fixed:N` drafts N every round;
`confidence:T` drafts up to MAX_DRAFT and stops after a token the drafter drew with top
probability below T; `acceptance` and `auto` (the default) price every γ with the online
estimates (`estimates.ts`). `dynamic-exit` and `channel-aware` are not ported yet and are
refused by name. */

import { InputError } from "./errors.js";
import { CostModel, MAX_DRAFT } from "./estimates.js";
import type { Plan, RoundStats } from "./round.js";

export interface DraftLengthPolicy {
  readonly maxLength: number;
  plan(source: string | null): Plan;
  observe(stats: RoundStats): void;
}

export class FixedLength implements DraftLengthPolicy {
  constructor(readonly length: number) {}
  get maxLength(): number {
    return this.length;
  }
  plan(): Plan {
    return { length: this.length, exitLayer: null, minConfidence: 0 };
  }
  observe(): void {}
}


export class Confidence implements DraftLengthPolicy {
  constructor(readonly threshold: number, readonly maxLength = MAX_DRAFT) {}
  plan(): Plan {
    return { length: this.maxLength, exitLayer: null, minConfidence: this.threshold };
  }
  observe(): void {}
}

/** γ maximising expected tokens per second from the online estimates. */
export class Acceptance implements DraftLengthPolicy {
  constructor(readonly maxLength = MAX_DRAFT, readonly cost = new CostModel()) {}
  plan(): Plan {
    return { length: this.cost.bestLength(this.maxLength)[0], exitLayer: null, minConfidence: 0 };
  }
  observe(stats: RoundStats): void {
    this.cost.observe(stats);
  }
}

/** Speculate only when it wins (`policies.Auto`): γ = 0, one plain step priced by its own
 * measured time, is a candidate like any other; while plain decoding is the better bet, a
 * short draft is probed every `probeGap` plain rounds (backing off to `maxProbeGap` while
 * probes keep losing clearly), so speculation switches back on when the text gets
 * predictable again. */
export class Auto implements DraftLengthPolicy {
  private gap = 0;
  private plainRounds = 0;
  constructor(readonly maxLength = MAX_DRAFT, readonly cost = new CostModel()) {}

  plan(): Plan {
    return { length: this.length(), exitLayer: null, minConfidence: 0 };
  }

  private length(): number {
    const c = this.cost;
    if (c.tDraft === null) return Math.min(2, this.maxLength); // learn α and the draft cost first
    if (!c.roundTime.has(0)) return 0; // then what a plain step costs here
    const p = c.priors;
    const [g, rate] = c.bestLength(this.maxLength, 1);
    const plain = c.rate(0);
    if (rate > plain) {
      this.gap = p.probeGap;
      return g;
    }
    this.gap = this.gap || p.probeGap;
    this.plainRounds += 1;
    if (this.plainRounds >= this.gap) {
      this.plainRounds = 0;
      if (rate < p.clearlyLosing * plain) this.gap = Math.min(2 * this.gap, p.maxProbeGap);
      return g;
    }
    return 0;
  }

  /** A new text: probes start again, the last text's acceptance weighs `carriedRounds`. */
  newGeneration(): void {
    this.gap = this.plainRounds = 0;
    this.cost.acceptance.carry(this.cost.priors.carriedRounds);
  }

  observe(stats: RoundStats): void {
    if (stats.index === 1) this.newGeneration(); // a new generation's first round
    this.cost.observe(stats);
  }
}

/** An adaptive policy per member of a drafter chain (`lookup+eagle`; `PerSource` in
 * `draft_length.py`), each learning only from the rounds its member drafted: prompt lookup's
 * drafts cost nothing and pass whole or not at all, a model's cost a step each. `main` plans
 * for the chain's last member (and any source not in `apart`). */
export class PerSource implements DraftLengthPolicy {
  constructor(readonly main: DraftLengthPolicy, readonly apart: Map<string, DraftLengthPolicy>) {}
  get maxLength(): number {
    return this.main.maxLength;
  }
  plan(source: string | null): Plan {
    return (this.apart.get(source ?? "") ?? this.main).plan(source);
  }
  observe(stats: RoundStats): void {
    if (stats.index === 1) {
      // a new generation: every member's, not only the one that drafted its first round
      for (const member of [this.main, ...this.apart.values()]) {
        if (member instanceof Auto) member.newGeneration();
      }
    }
    (this.apart.get(stats.source ?? "") ?? this.main).observe(stats);
  }
}

/** `policy` over a chain whose members are named `members`: an adaptive one prices each
 * member but the last apart, as a copying drafter (`registry.per_source`); others as they are. */
export function perSource(policy: DraftLengthPolicy, members: string[]): DraftLengthPolicy {
  if (members.length < 2 || !(policy instanceof Auto || policy instanceof Acceptance)) return policy;
  const copying = (): DraftLengthPolicy => {
    const base = policy.cost.priors;
    const priors = { ...base, statePrior: base.statePriorFirst };
    return policy instanceof Acceptance ? new Acceptance(MAX_DRAFT, new CostModel(priors))
      : new Auto(MAX_DRAFT, new CostModel(priors));
  };
  return new PerSource(policy, new Map(members.slice(0, -1).map((name) => [name, copying()])));
}

const PORTED = "fixed:N, confidence:T, acceptance and auto";

/** "fixed:4" (fixed alone: 4) -> its policy; any other name is refused with what exists. */
export function parsePolicy(name: string): DraftLengthPolicy {
  const [kind, arg] = name.split(":", 2);
  if (kind === "fixed") {
    const n = arg === undefined || arg === "" ? 4 : Number(arg);
    if (!Number.isInteger(n) || n < 0 || n > 64) {
      throw new InputError(`draft policy ${name}: N must be an integer in 0..64 (e.g. fixed:4)`);
    }
    return new FixedLength(n);
  }
  if (kind === "confidence") {
    const t = arg === undefined || arg === "" ? 0.4 : Number(arg);
    if (!(t >= 0 && t <= 1)) throw new InputError(`draft policy ${name}: T must be in 0..1 (e.g. confidence:0.4)`);
    return new Confidence(t);
  }
  if (kind === "auto" || kind === "acceptance") {
    if (arg !== undefined) throw new InputError(`draft policy ${kind} takes no argument (got '${name}')`);
    return kind === "auto" ? new Auto() : new Acceptance();
  }
  if (["dynamic-exit", "channel-aware"].includes(kind)) {
    throw new InputError(
      `draft policy '${name}' runs in the Python runtime; the JavaScript runtime has ${PORTED} so far`,
    );
  }
  throw new InputError(`unknown draft policy '${name}'; the JavaScript runtime has ${PORTED}`);
}
