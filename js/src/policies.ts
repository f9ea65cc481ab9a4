/** Draft-length policies (`runtime/policies.py`): a policy plans each round (γ, exit layer,
confidence stop) and observes the round's stats. `fixed:N` drafts N every round;
`confidence:T` drafts up to MAX_DRAFT and stops after a token the drafter drew with top
probability below T. The measured ones (`acceptance`, `auto`, `dynamic-exit`,
`channel-aware`) are not ported yet and are refused by name. */

import { InputError } from "./errors.js";
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

/** The longest draft an adaptive policy plans (`estimates.MAX_DRAFT`). */
export const MAX_DRAFT = 12;

export class Confidence implements DraftLengthPolicy {
  constructor(readonly threshold: number, readonly maxLength = MAX_DRAFT) {}
  plan(): Plan {
    return { length: this.maxLength, exitLayer: null, minConfidence: this.threshold };
  }
  observe(): void {}
}

const PORTED = "fixed:N and confidence:T";

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
  if (["acceptance", "auto", "dynamic-exit", "channel-aware"].includes(kind)) {
    throw new InputError(
      `draft policy '${name}' runs in the Python runtime; the JavaScript runtime has ${PORTED} so far`,
    );
  }
  throw new InputError(`unknown draft policy '${name}'; the JavaScript runtime has ${PORTED}`);
}
