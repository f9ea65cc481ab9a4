/** Draft-length policies (`runtime/policies.py`): a policy plans each round (γ, exit layer)
and observes the round's stats. `fixed:N` drafts N every round; the adaptive ones
(`acceptance`, `auto`, `confidence`, `dynamic-exit`, `channel-aware`) are not ported yet and
are refused by name. */

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
    return { length: this.length, exitLayer: null };
  }
  observe(): void {}
}

const PORTED = "fixed:N";

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
  if (["confidence", "acceptance", "auto", "dynamic-exit", "channel-aware"].includes(kind)) {
    throw new InputError(
      `draft policy '${name}' runs in the Python runtime; the JavaScript runtime has ${PORTED} so far`,
    );
  }
  throw new InputError(`unknown draft policy '${name}'; the JavaScript runtime has ${PORTED}`);
}
